// Package etcd is the etcd v3 coordination store.
package etcd
