package redis

import "testing"

func TestInfoField(t *testing.T) {
	info := "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\n"
	if v, ok := infoField(info, "redis_version"); !ok || v != "7.0.15" {
		t.Fatalf("infoField = %q, %v", v, ok)
	}
	if _, ok := infoField(info, "valkey_version"); ok {
		t.Fatal("found a field that is not there")
	}
}
