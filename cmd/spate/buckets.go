package main

// The bucket drivers linked by default: local directories as buckets and
// Amazon S3 (and S3-compatible stores: MinIO, Ceph, R2, …). Build with
// -tags spate_gcs,spate_azure for Google Cloud Storage and Azure Blob
// Storage; they are left out by default because they double the build.
import (
	_ "gocloud.dev/blob/fileblob"
	_ "gocloud.dev/blob/s3blob"
)

var bucketSchemes = []string{"file", "s3"}
