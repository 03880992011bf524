//go:build !linux

package filesource

import (
	"errors"
	"os"
)

var errNoIdentity = errors.New("filesource: following files needs Linux (file identities by device, inode and birth time)")

func identify(string) (FileID, error) { return FileID{}, errNoIdentity }

func identifyOpen(*os.File) (FileID, error) { return FileID{}, errNoIdentity }

func links(os.FileInfo) (uint64, bool) { return 0, false }
