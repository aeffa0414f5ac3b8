package messages

import (
	"cmp"
	"slices"
	"strings"
	"unicode/utf8"
)

// Domain is the namespace of a resource key.
type Domain uint8

// The resource-key domains of DESIGN.md §1.
const (
	DomainCluster Domain = iota + 1
	DomainDBName
	DomainCollectionName
	DomainPrivilege
	DomainSnapshotName
)

var domainNames = map[Domain]string{
	DomainCluster:        "Cluster",
	DomainDBName:         "DBName",
	DomainCollectionName: "CollectionName",
	DomainPrivilege:      "Privilege",
	DomainSnapshotName:   "SnapshotName",
}

// String names the domain.
func (d Domain) String() string {
	if s, ok := domainNames[d]; ok {
		return s
	}
	return "invalid"
}

// Valid reports whether d is a declared domain.
func (d Domain) Valid() bool { _, ok := domainNames[d]; return ok }

// parseDomain is the inverse of Domain.String.
func parseDomain(s string) (Domain, bool) {
	for d, name := range domainNames {
		if name == s {
			return d, true
		}
	}
	return 0, false
}

// KeyRule declares one resource key a broadcast type takes; the key itself
// comes from the broadcast's [KeyScope].
type KeyRule struct {
	Domain    Domain
	Exclusive bool
}

// ResourceKey is a lock on one resource, taken by a broadcast.
type ResourceKey struct {
	Domain Domain
	// Key is empty for cluster-wide domains (Cluster, Privilege), the
	// database name for DBName, "<db>/<collection>" for CollectionName and
	// the snapshot name for SnapshotName.
	Key       string
	Exclusive bool
}

// String renders "S:<domain>:<key>" or "X:<domain>:<key>", the header form.
func (k ResourceKey) String() string {
	mode := "S"
	if k.Exclusive {
		mode = "X"
	}
	return mode + ":" + k.Domain.String() + ":" + k.Key
}

// ParseResourceKey parses the String form of a resource key.
func ParseResourceKey(s string) (ResourceKey, error) {
	parts := strings.SplitN(s, ":", 3)
	if len(parts) != 3 || (parts[0] != "S" && parts[0] != "X") {
		return ResourceKey{}, wrapInvalid(ErrMalformed, "resource key %q: want S|X:<domain>:<key>", s)
	}
	d, ok := parseDomain(parts[1])
	if !ok {
		return ResourceKey{}, wrapInvalid(ErrMalformed, "resource key %q: unknown domain", s)
	}
	k := ResourceKey{Domain: d, Key: parts[2], Exclusive: parts[0] == "X"}
	if err := checkKey(k); err != nil {
		return ResourceKey{}, err
	}
	return k, nil
}

// MaxKeyLen bounds the key of a resource key.
const MaxKeyLen = 512

// checkKey validates a resource key's key against its domain.
func checkKey(k ResourceKey) error {
	global := k.Domain == DomainCluster || k.Domain == DomainPrivilege
	switch {
	case global && k.Key != "":
		return wrapInvalid(ErrMalformed, "resource key %s: domain %s takes no key", k, k.Domain)
	case !global && k.Key == "":
		return wrapInvalid(ErrMalformed, "resource key %s: domain %s needs a key", k, k.Domain)
	case len(k.Key) > MaxKeyLen:
		return wrapInvalid(ErrMalformed, "resource key of %d bytes exceeds %d", len(k.Key), MaxKeyLen)
	case !printable(k.Key):
		return wrapInvalid(ErrMalformed, "resource key %q: control characters are not allowed", k.Key)
	}
	return nil
}

// printable reports whether s can travel as a NATS header value unchanged:
// no ASCII control characters, and no leading or trailing blank (nats.go
// trims those).
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return false
		}
	}
	if s == "" || asciiNonBlank(s[0]) && asciiNonBlank(s[len(s)-1]) {
		return true // nothing TrimSpace would remove
	}
	return s == strings.TrimSpace(s)
}

// asciiNonBlank reports whether a byte other than a control character is
// ASCII and not a space.
func asciiNonBlank(c byte) bool { return c < utf8.RuneSelf && c != ' ' }

// KeyScope names the resources a broadcast acts on; the type's KeyRules pick
// what they need from it.
type KeyScope struct {
	DBName         string
	CollectionName string
	SnapshotName   string
}

// SharedCluster is the key every broadcast takes.
var SharedCluster = ResourceKey{Domain: DomainCluster}

// ResourceKeys returns the keys a broadcast of t in scope takes: t's rules
// applied to scope, plus SharedCluster, deduplicated (exclusive wins) and
// sorted, which is the order in which they must be locked.
func ResourceKeys(t *Type, scope KeyScope) ([]ResourceKey, error) {
	keys := []ResourceKey{SharedCluster}
	for _, r := range t.Keys {
		k, err := ruleKey(r, scope)
		if err != nil {
			return nil, wrapInvalid(ErrBadTarget, "type %s: %v", t.Name, err)
		}
		keys = append(keys, k)
	}
	return NormalizeKeys(keys), nil
}

// ruleKey applies one rule to a scope.
func ruleKey(r KeyRule, s KeyScope) (ResourceKey, error) {
	k := ResourceKey{Domain: r.Domain, Exclusive: r.Exclusive}
	switch r.Domain {
	case DomainDBName:
		k.Key = s.DBName
	case DomainCollectionName:
		if s.DBName != "" && s.CollectionName != "" {
			k.Key = s.DBName + "/" + s.CollectionName
		}
	case DomainSnapshotName:
		k.Key = s.SnapshotName
	}
	return k, checkKey(k)
}

// NormalizeKeys sorts keys by (domain, key), merges duplicates (exclusive
// wins) and returns the result.
func NormalizeKeys(keys []ResourceKey) []ResourceKey {
	out := slices.Clone(keys)
	slices.SortFunc(out, compareKeys)
	merged := out[:0]
	for _, k := range out {
		if n := len(merged); n > 0 && merged[n-1].Domain == k.Domain && merged[n-1].Key == k.Key {
			merged[n-1].Exclusive = merged[n-1].Exclusive || k.Exclusive
			continue
		}
		merged = append(merged, k)
	}
	return merged
}

// compareKeys orders keys by domain then key.
func compareKeys(a, b ResourceKey) int {
	if c := cmp.Compare(a.Domain, b.Domain); c != 0 {
		return c
	}
	return cmp.Compare(a.Key, b.Key)
}

// Conflicts reports whether two keys cannot be held at once: same resource,
// and at least one is exclusive.
func (k ResourceKey) Conflicts(o ResourceKey) bool {
	return k.Domain == o.Domain && k.Key == o.Key && (k.Exclusive || o.Exclusive)
}
