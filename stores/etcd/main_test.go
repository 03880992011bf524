package etcd_test

import (
	"testing"

	"github.com/spate-go/spate/internal/etcdtest"
)

func TestMain(m *testing.M) { etcdtest.Main(m) }
