// Command etcd is etcd's own server, built from go.etcd.io/etcd/server/v3 at the release
// Kubernetes pins: etcd's root module (its `main`) carries replace directives, which a
// module outside etcd's tree cannot take, so this calls the same entry point.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
