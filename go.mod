module github.com/dyadfs/dyadfs

go 1.26.8

require (
	github.com/hanwen/go-fuse/v2 v2.12.1
	github.com/spf13/pflag v1.0.10
	golang.org/x/sys v0.49.0
)
