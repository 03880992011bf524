package embedetcd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// The default store's own records live outside spate's job root
// ("/spate/"), so that no job listing sees them:
//
//   - hostKey names the process that hosts the store, written by it when it
//     starts the server, so that the processes that join it can say, once
//     it is gone, which process it was and where its data is;
//   - attendPrefix+ID is one process that uses the store (a backfill
//     worker), written when it connects and deleted when it leaves, so that
//     the host keeps the store up until every process that uses it has
//     left — also one that has not yet announced itself in its job, and one
//     that is frozen past its lease.
const (
	hostKey      = "/spate-embedded/host"
	attendPrefix = "/spate-embedded/attendees/"
)

// HostInfo names the process that hosts the default store.
type HostInfo struct {
	PID      int       `json:"pid"`
	Host     string    `json:"host"`
	Addr     string    `json:"addr"`
	DataDir  string    `json:"data_dir"` // absolute
	Command  string    `json:"command,omitempty"`
	Instance string    `json:"instance,omitempty"` // its worker's --instance, when it runs one
	Since    time.Time `json:"since"`
}

// String names the process for people: "pid 4242 on host h (spate
// backfill, worker w1)".
func (h HostInfo) String() string {
	s := fmt.Sprintf("pid %d on host %s", h.PID, h.Host)
	var what []string
	if h.Command != "" {
		what = append(what, "spate "+h.Command)
	}
	if h.Instance != "" {
		what = append(what, "worker "+h.Instance)
	}
	if len(what) > 0 {
		s += " (" + strings.Join(what, ", ") + ")"
	}
	return s
}

// Running reports whether the recorded host still runs, as far as this
// process can tell (where it cannot, it assumes so). A record left by a
// host that is gone is not the current host's: a spate from before host
// records started the store.
func (h HostInfo) Running() bool {
	if !canTellRunning {
		return true
	}
	host, _ := os.Hostname()
	return h.Host == host && processRuns(h.PID)
}

// Attendee is one process that uses the default store.
type Attendee struct {
	PID      int       `json:"pid"`
	Host     string    `json:"host"`
	Instance string    `json:"instance,omitempty"`
	Since    time.Time `json:"since"`
	key      string
}

// String names the attendee for people.
func (a Attendee) String() string {
	if a.Instance != "" {
		return fmt.Sprintf("worker %s (pid %d)", a.Instance, a.PID)
	}
	return fmt.Sprintf("pid %d", a.PID)
}

// client is this process's client of the store, made on first use.
func (l *Local) client() (*clientv3.Client, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cli != nil {
		return l.cli, nil
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{l.Endpoint},
		DialTimeout: 2 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, err
	}
	l.cli = cli
	return cli, nil
}

// ThisProcess describes this process as the store's host, serving addr
// from dataDir for command.
func ThisProcess(addr, dataDir, command string) HostInfo {
	host, _ := os.Hostname()
	if abs, err := filepath.Abs(dataDir); err == nil {
		dataDir = abs
	}
	return HostInfo{PID: os.Getpid(), Host: host, Addr: addr, DataDir: dataDir, Command: command, Since: time.Now().UTC()}
}

// RecordHost writes info as the store's host record (only its host does).
func (l *Local) RecordHost(ctx context.Context, info HostInfo) error {
	if !l.Hosted() {
		return errors.New("embedetcd: only the process that hosts the store records itself as its host")
	}
	cli, err := l.client()
	if err != nil {
		return err
	}
	b, err := json.Marshal(info)
	if err != nil {
		return err
	}
	_, err = cli.Put(ctx, hostKey, string(b))
	return err
}

// ReadHost reads the host record; ok is false when there is none (a store
// started by an older spate).
func (l *Local) ReadHost(ctx context.Context) (info HostInfo, ok bool, err error) {
	cli, err := l.client()
	if err != nil {
		return HostInfo{}, false, err
	}
	resp, err := cli.Get(ctx, hostKey)
	if err != nil || len(resp.Kvs) == 0 {
		return HostInfo{}, false, err
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &info); err != nil {
		return HostInfo{}, false, fmt.Errorf("embedetcd: unreadable host record %s: %w", hostKey, err)
	}
	return info, true, nil
}

// Attend records this process as one that uses the store, until leave is
// called. A record whose process is gone (it was killed) is deleted by the
// host when it counts the attendees.
func (l *Local) Attend(ctx context.Context, instance string) (leave func(), err error) {
	cli, err := l.client()
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	a := Attendee{PID: os.Getpid(), Host: host, Instance: instance, Since: time.Now().UTC()}
	b, err := json.Marshal(a)
	if err != nil {
		return nil, err
	}
	key := attendPrefix + host + "-" + strconv.Itoa(a.PID)
	if _, err := cli.Put(ctx, key, string(b)); err != nil {
		return nil, err
	}
	return func() {
		dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, _ = cli.Delete(dctx, key)
	}, nil
}

// Attendees lists the other processes that use the store and still run.
// It deletes the records of processes that are gone. Whether a process
// runs is known on Unix, where every attendee is on this machine (the store
// serves loopback only); elsewhere no record counts.
func (l *Local) Attendees(ctx context.Context) ([]Attendee, error) {
	cli, err := l.client()
	if err != nil {
		return nil, err
	}
	resp, err := cli.Get(ctx, attendPrefix, clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	var out []Attendee
	for _, kv := range resp.Kvs {
		var a Attendee
		if json.Unmarshal(kv.Value, &a) != nil || a.Host == host && !processRuns(a.PID) {
			_, _ = cli.Delete(ctx, string(kv.Key))
			continue
		}
		if a.Host != host || a.PID == os.Getpid() {
			continue
		}
		a.key = string(kv.Key)
		out = append(out, a)
	}
	return out, nil
}
