package redis

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestInfoField(t *testing.T) {
	info := "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\n"
	v, ok := infoField(info, "redis_version")
	require.True(t, ok, "infoField(redis_version) = %q, %v", v, ok)
	require.Equal(t, "7.0.15", v, "infoField(redis_version)")
	_, ok = infoField(info, "valkey_version")
	require.False(t, ok, "found a field that is not there")
}
