package main

import "github.com/spate-go/spate/stores/etcd"

// etcdJobRoot is where the etcd driver's URL opener keeps jobs.
const etcdJobRoot = etcd.DefaultRoot

// etcdPrefix is a job's key prefix in etcd, as the CLI's stores use it.
func etcdPrefix(job string) string { return etcd.JobPrefix(etcd.DefaultRoot, job) }
