package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"
)

// repoRoot is the repository's root, from this package's directory.
const repoRoot = "../.."

var (
	mdLink    = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)\)`)
	mdHeading = regexp.MustCompile(`(?m)^#{1,6} +(.+)$`)
)

// headingAnchor is the anchor a heading gets on GitHub: lower case,
// punctuation but '-' and '_' dropped, spaces turned to '-'.
func headingAnchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors are the heading anchors of a markdown file.
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	out := map[string]bool{}
	for _, m := range mdHeading.FindAllStringSubmatch(string(data), -1) {
		out[headingAnchor(m[1])] = true
	}
	return out
}

// Every link of the README and of docs/ resolves in a clone: it names a
// file or directory inside the repository (and a heading of it, for an
// anchor), or is a web address.
func TestDocumentationLinksResolveInAClone(t *testing.T) {
	root, err := filepath.Abs(repoRoot)
	require.NoError(t, err)
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	files := append([]string{filepath.Join(root, "README.md")}, docs...)
	require.Greater(t, len(files), 1, "docs/ has the design summary")
	n := 0
	for _, file := range files {
		data, err := os.ReadFile(file)
		require.NoError(t, err)
		for _, m := range mdLink.FindAllStringSubmatch(string(data), -1) {
			link := m[1]
			if strings.HasPrefix(link, "https://") || strings.HasPrefix(link, "http://") {
				continue
			}
			where := filepath.Base(file) + ": " + link
			path, anchor, _ := strings.Cut(link, "#")
			target := file
			if path != "" {
				target = filepath.Join(filepath.Dir(file), path)
			}
			rel, err := filepath.Rel(root, target)
			require.NoError(t, err, where)
			require.False(t, rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)), "%s leaves the repository", where)
			_, err = os.Stat(target)
			require.NoError(t, err, "%s does not resolve", where)
			if anchor != "" {
				require.True(t, anchors(t, target)[anchor], "%s: no heading with that anchor", where)
			}
			n++
		}
	}
	require.Greater(t, n, 10)
}

// The README's pointer to the client's example names the file that holds
// it and a test pattern that runs it (go doc does not print examples).
func TestREADMEPointsAtTheClientExample(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	require.NoError(t, err)
	readme := string(data)
	for _, line := range strings.Split(readme, "\n") {
		if strings.Contains(line, "go doc") {
			require.NotContains(t, strings.ToLower(line), "example", "go doc does not print examples: %q", line)
		}
	}
	m := regexp.MustCompile("runnable example \\(\\[`([^`]+)`\\]\\([^)]+\\); `go test -run '([^']+)' -v (\\./\\S+)` runs it\\)").FindStringSubmatch(readme)
	require.NotNil(t, m, "the README names the client example's file and how to run it")
	src, err := os.ReadFile(filepath.Join(repoRoot, m[1]))
	require.NoError(t, err)
	require.Equal(t, "./"+filepath.Dir(m[1]), m[3], "the test command runs the package of the example")
	fn := regexp.MustCompile(`(?m)^func (Example\w*)\(\) \{$`).FindAllStringSubmatch(string(src), -1)
	require.NotEmpty(t, fn, "%s has no example", m[1])
	pattern := regexp.MustCompile(m[2])
	matched := false
	for _, f := range fn {
		matched = matched || pattern.MatchString(f[1])
	}
	require.True(t, matched, "-run %q matches no example of %s", m[2], m[1])
	require.Contains(t, string(src), "// Output:", "the example checks its output, so running it proves it")
}
