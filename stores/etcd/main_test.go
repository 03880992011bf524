package etcd_test

import (
	"testing"

	"github.com/spate-go/spate/internal/etcdservers"
)

func TestMain(m *testing.M) { etcdservers.Main(m) }
