//go:build spate_azure

package main

import _ "gocloud.dev/blob/azureblob"

func init() { bucketSchemes = append(bucketSchemes, "azblob") }
