package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The streamwal binary these tests run as users do: built once per test
// binary run, without -race (it is the system under test, not the test, and
// builds and runs much faster without it), removed when the tests end.
var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

// withBinary runs a package's tests, then removes the binary built for them.
type withBinary struct{ m *testing.M }

// Run runs the tests and removes the binary.
func (w withBinary) Run() int {
	defer func() {
		if binDir != "" {
			_ = os.RemoveAll(binDir)
		}
	}()
	return w.m.Run()
}

// streamwalBinary builds the command (once) and returns its path.
func streamwalBinary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() { binPath, binErr = buildBinary() })
	if binErr != nil {
		t.Fatalf("build streamwal: %v", binErr)
	}
	return binPath
}

// buildBinary runs go build of this package into a temporary directory.
func buildBinary() (string, error) {
	dir, err := os.MkdirTemp("", "streamwal-bin-")
	if err != nil {
		return "", err
	}
	binDir = dir
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	path := filepath.Join(dir, "streamwal")
	out, err := exec.Command(goTool, "build", "-o", path, ".").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %w\n%s", err, out)
	}
	return path, nil
}

// serveProc is `streamwal serve` (or another long-running command:
// coord, node) running as a child process.
type serveProc struct {
	t       testing.TB
	name    string // the command, for messages
	cmd     *exec.Cmd
	stdout  syncBuffer
	stderr  syncBuffer
	started time.Time // just before the process started
	done    chan struct{}
	waitErr error // set when done is closed
}

// startServe starts `streamwal serve --data-dir dir --port 0` with extra
// args. The process is killed when the test ends if it still runs, and its
// output is logged if the test failed.
func startServe(t testing.TB, dir string, args ...string) *serveProc {
	t.Helper()
	return startProcess(t, nil, append([]string{"serve", "--data-dir", dir, "--port", "0"}, args...)...)
}

// startProcess starts the streamwal binary with args (the command first)
// and, added to the test's environment, env ("NAME=value"). The process
// is killed when the test ends if it still runs, and its output is logged
// if the test failed.
func startProcess(t testing.TB, env []string, args ...string) *serveProc {
	t.Helper()
	return startCmd(t, args[0], exec.Command(streamwalBinary(t), args...), env)
}

// startCmd starts cmd (any program: a script, say) as startProcess
// starts the streamwal binary, under name in messages.
func startCmd(t testing.TB, name string, cmd *exec.Cmd, env []string) *serveProc {
	t.Helper()
	p := &serveProc{t: t, name: name, done: make(chan struct{}), cmd: cmd}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", p.name, err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(p.dumpIfFailed)
	t.Cleanup(p.kill)
	return p
}

// pid is the process ID.
func (p *serveProc) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process has ended.
func (p *serveProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitURL waits until serve prints the URL it serves on, failing the test
// if it exits first or the deadline passes.
func (p *serveProc) waitURL(timeout time.Duration) string {
	p.t.Helper()
	var url string
	err := pollUntil(timeout, func() (bool, error) {
		if m := urlLine.FindStringSubmatch(p.stdout.String()); m != nil {
			url = m[1]
			return true, nil
		}
		if p.exited() {
			return false, fmt.Errorf("%s exited before serving: %v", p.name, p.waitErr)
		}
		return false, nil
	})
	if err != nil {
		p.t.Fatalf("%s (pid %d): %v", p.name, p.pid(), err)
	}
	return url
}

// waitOutput waits until serve's standard output contains s (for
// example the banner's last line, once waitURL saw its first), failing the
// test if it exits first or the deadline passes, and returns that output.
func (p *serveProc) waitOutput(timeout time.Duration, s string) string {
	p.t.Helper()
	var out string
	err := pollUntil(timeout, func() (bool, error) {
		if out = p.stdout.String(); strings.Contains(out, s) {
			return true, nil
		}
		if p.exited() {
			return false, fmt.Errorf("%s exited: %v", p.name, p.waitErr)
		}
		return false, nil
	})
	if err != nil {
		p.t.Fatalf("%s (pid %d) never printed %q: %v", p.name, p.pid(), s, err)
	}
	return out
}

// signal sends sig to the process.
func (p *serveProc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %v to %s (pid %d): %v", sig, p.name, p.pid(), err)
	}
}

// waitExit waits until the process ends and returns how it ended.
func (p *serveProc) waitExit(timeout time.Duration) *os.ProcessState {
	p.t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState
	case <-time.After(timeout):
		p.t.Fatalf("%s (pid %d) still runs %s after it was told to stop", p.name, p.pid(), timeout)
		return nil
	}
}

// stop ends the process the way sig does and waits until it is gone.
// SIGSTOP means: freeze it, and once it is frozen, SIGKILL it. A SIGINT or
// SIGTERM must end it cleanly (exit status 0).
func (p *serveProc) stop(sig syscall.Signal) {
	p.t.Helper()
	if sig == syscall.SIGSTOP {
		p.signal(syscall.SIGSTOP)
		p.waitStopped(10 * time.Second)
		sig = syscall.SIGKILL
	}
	p.signal(sig)
	st := p.waitExit(30 * time.Second)
	if sig == syscall.SIGKILL {
		return
	}
	if !st.Success() {
		p.t.Fatalf("%s (pid %d) after %v: %v, want a clean exit", p.name, p.pid(), sig, p.waitErr)
	}
}

// waitStopped waits until the kernel reports the process stopped (state
// T in /proc; where there is no /proc it does not wait).
func (p *serveProc) waitStopped(timeout time.Duration) {
	p.t.Helper()
	stat := fmt.Sprintf("/proc/%d/stat", p.pid())
	if _, err := os.Stat(stat); err != nil {
		return
	}
	err := pollUntil(timeout, func() (bool, error) {
		b, err := os.ReadFile(stat)
		if err != nil {
			return false, err
		}
		// pid (comm) state ...: the state follows the last ')'.
		fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		return len(fields) > 0 && fields[0] == "T", nil
	})
	if err != nil {
		p.t.Fatalf("%s (pid %d) not stopped after SIGSTOP: %v", p.name, p.pid(), err)
	}
}

// kill kills the process if it still runs and waits for it.
func (p *serveProc) kill() {
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// dumpIfFailed logs the process's output when the test failed.
func (p *serveProc) dumpIfFailed() {
	if !p.t.Failed() {
		return
	}
	p.t.Logf("%s (pid %d, %v) standard output:\n%s\nstandard error:\n%s",
		p.name, p.pid(), p.cmd.ProcessState, p.stdout.String(), p.stderr.String())
}

// runBinary runs the streamwal binary with args and stdin and returns its
// standard output; its error carries the standard error.
func runBinary(t testing.TB, stdin string, args ...string) (string, error) {
	t.Helper()
	return runBinaryEnv(t, nil, stdin, args...)
}

// runBinaryEnv is runBinary with env ("NAME=value") added to the test's
// environment.
func runBinaryEnv(t testing.TB, env []string, stdin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, streamwalBinary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(stdin), &out, &errOut
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("streamwal %s: %w\nstandard error: %s", strings.Join(args, " "), err, errOut.String())
	}
	return out.String(), nil
}

// mustRunBinary is runBinary that must succeed.
func mustRunBinary(t testing.TB, stdin string, args ...string) string {
	t.Helper()
	out, err := runBinary(t, stdin, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// errPollTimeout is the error of a condition that did not hold in time.
var errPollTimeout = errors.New("timed out")

// pollUntil evaluates cond every 10 ms until it holds, it fails, or
// timeout passes.
func pollUntil(timeout time.Duration, cond func() (bool, error)) error {
	return pollEvery(timeout, 10*time.Millisecond, cond)
}

// pollEvery is pollUntil evaluating cond every interval: for a condition
// that costs a command or a round of requests.
func pollEvery(timeout, interval time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w after %s", errPollTimeout, timeout)
		}
		<-tick.C
	}
}
