//go:build spate_gcs

package main

import _ "gocloud.dev/blob/gcsblob"

func init() { bucketSchemes = append(bucketSchemes, "gs") }
