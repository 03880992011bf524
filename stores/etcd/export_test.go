package etcd

import clientv3 "go.etcd.io/etcd/client/v3"

// SetReapHook runs f after each background lease revocation. Call it right
// after New, before the store is used.
func SetReapHook(s *Store, f func(clientv3.LeaseID)) { s.s.reapHook = f }

// SetLagHook runs f when a watcher of s is cut for lagging. Call it right
// after New, before the store is used.
func SetLagHook(s *Store, f func()) { s.s.lagHook = f }
