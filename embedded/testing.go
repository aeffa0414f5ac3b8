package embedded

import "testing"

// StartTest starts a server for a test: StoreDir is t.TempDir(), the port is
// free, and the server is shut down when the test ends. Each function in
// opts may adjust the options (for example set SyncAlways or a logger) before
// the server starts. StartTest fails the test if the server cannot start.
func StartTest(t testing.TB, opts ...func(*Options)) *Server {
	t.Helper()
	o := Options{StoreDir: t.TempDir()}
	for _, f := range opts {
		f(&o)
	}
	s, err := Start(o)
	if err != nil {
		t.Fatalf("embedded.StartTest: %v", err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// StartTestCluster starts a cluster for a test: BaseDir is t.TempDir(),
// all ports are free, and the cluster is shut down when the test ends. Each
// function in opts may adjust the options before the cluster starts.
// StartTestCluster fails the test if the cluster cannot start.
func StartTestCluster(t testing.TB, opts ...func(*ClusterOptions)) *Cluster {
	t.Helper()
	o := ClusterOptions{BaseDir: t.TempDir()}
	for _, f := range opts {
		f(&o)
	}
	c, err := StartCluster(o)
	if err != nil {
		t.Fatalf("embedded.StartTestCluster: %v", err)
	}
	t.Cleanup(c.Shutdown)
	return c
}
