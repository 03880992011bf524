package etcd_test

import "go.uber.org/zap"

func nopLogger() *zap.Logger { return zap.NewNop() }
