//go:build unix

package embedetcd

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/internal/freeport"
)

// The host records itself and a joiner reads the record; the attendees a
// host counts are the other processes that recorded themselves and still
// run (a stopped one too), and the record of one that is gone is deleted.
func TestHostRecordAndAttendees(t *testing.T) {
	ctx := t.Context()
	addr := "127.0.0.1:" + strconv.Itoa(freeport.WithOffset(t, 10))
	opts := LocalOptions{DataDir: filepath.Join(t.TempDir(), "etcd"), ClientAddr: addr}
	host, err := StartOrJoin(ctx, opts)
	require.NoError(t, err)
	defer host.Close()
	joiner, err := StartOrJoin(ctx, opts)
	require.NoError(t, err)
	defer joiner.Close()

	_, ok, err := joiner.ReadHost(ctx)
	require.NoError(t, err)
	require.False(t, ok, "a host record before the host wrote one")
	info := ThisProcess(addr, opts.DataDir, "backfill")
	info.Instance = "w0"
	require.Error(t, joiner.RecordHost(ctx, info), "a joiner must not record itself as the host")
	require.NoError(t, host.RecordHost(ctx, info))
	got, ok, err := joiner.ReadHost(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, os.Getpid(), got.PID)
	assert.True(t, filepath.IsAbs(got.DataDir), got.DataDir)
	assert.True(t, got.Running(), "this process runs")
	assert.Contains(t, got.String(), "pid "+strconv.Itoa(os.Getpid())+" on host ")
	assert.Contains(t, got.String(), "(spate backfill, worker w0)")

	// This process's own record never counts.
	leave, err := joiner.Attend(ctx, "w1")
	require.NoError(t, err)
	users, err := host.Attendees(ctx)
	require.NoError(t, err)
	assert.Empty(t, users)

	// Another process that runs (stopped or not) counts; one that is gone
	// does not, and its record goes.
	live := exec.Command("sleep", "600")
	require.NoError(t, live.Start())
	t.Cleanup(func() { _ = live.Process.Kill(); _ = live.Wait() })
	dead := exec.Command("true")
	require.NoError(t, dead.Run())
	hostname, _ := os.Hostname()
	cli := client(t, host.Endpoint)
	for id, pid := range map[string]int{"w2": live.Process.Pid, "w3": dead.Process.Pid} {
		b, err := json.Marshal(Attendee{PID: pid, Host: hostname, Instance: id})
		require.NoError(t, err)
		_, err = cli.Put(ctx, attendPrefix+hostname+"-"+strconv.Itoa(pid), string(b))
		require.NoError(t, err)
	}
	users, err = host.Attendees(ctx)
	require.NoError(t, err)
	require.Len(t, users, 1, "%v", users)
	assert.Equal(t, "worker w2 (pid "+strconv.Itoa(live.Process.Pid)+")", users[0].String())
	resp, err := cli.Get(ctx, attendPrefix+hostname+"-"+strconv.Itoa(dead.Process.Pid))
	require.NoError(t, err)
	assert.Empty(t, resp.Kvs, "the record of a process that is gone stays")

	// Leaving deletes this process's record.
	leave()
	resp, err = cli.Get(ctx, attendPrefix+hostname+"-"+strconv.Itoa(os.Getpid()))
	require.NoError(t, err)
	assert.Empty(t, resp.Kvs, "leave left the record")
}
