// cnitool on Go's libcni, with the reference cnitool's interface, for
// cnid's tests: Debian's golang-github-appc-cni-dev ships libcni's source
// but not the reference tool's, so this is a small equivalent written for
// the tests (not a copy of the reference).
//
//	cnitool add|check|del <network> <netns-path>
//
// Environment, as the reference tool: NETCONFPATH (default /etc/cni/net.d),
// CNI_PATH, CNI_ARGS (K=V;K=V), CAP_ARGS (a JSON object), CNI_IFNAME
// (default eth0); and CNI_CACHE_DIR (libcni's cache dir, default
// /var/lib/cni), so that tests keep libcni's cache in a temp dir. The
// container ID is "cnitool-" and the first 20 hex digits of the SHA-512 of
// the absolute netns path. ADD prints the result; an error goes to stderr
// and the exit status is 1.
package main

import (
	"context"
	"crypto/sha512"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
)

func fail(format string, a ...interface{}) {
	fmt.Fprintf(os.Stderr, "cnitool: "+format+"\n", a...)
	os.Exit(1)
}

func main() {
	if len(os.Args) != 4 {
		fail("usage: cnitool add|check|del <network> <netns-path>")
	}
	verb, network := os.Args[1], os.Args[2]
	netns, err := filepath.Abs(os.Args[3])
	if err != nil {
		fail("netns path %q: %v", os.Args[3], err)
	}
	confDir := os.Getenv("NETCONFPATH")
	if confDir == "" {
		confDir = "/etc/cni/net.d"
	}
	list, err := libcni.LoadConfList(confDir, network)
	if err != nil {
		fail("%v", err)
	}
	var capArgs map[string]interface{}
	if s := os.Getenv("CAP_ARGS"); s != "" {
		if err := json.Unmarshal([]byte(s), &capArgs); err != nil {
			fail("CAP_ARGS: %v", err)
		}
	}
	var args [][2]string
	if s := os.Getenv("CNI_ARGS"); s != "" {
		for _, pair := range strings.Split(s, ";") {
			kv := strings.Split(pair, "=")
			if len(kv) != 2 || kv[0] == "" || kv[1] == "" {
				fail("CNI_ARGS: invalid pair %q", pair)
			}
			args = append(args, [2]string{kv[0], kv[1]})
		}
	}
	ifname := os.Getenv("CNI_IFNAME")
	if ifname == "" {
		ifname = "eth0"
	}
	sum := sha512.Sum512([]byte(netns))
	rt := &libcni.RuntimeConf{
		ContainerID:    fmt.Sprintf("cnitool-%x", sum[:10]),
		NetNS:          netns,
		IfName:         ifname,
		Args:           args,
		CapabilityArgs: capArgs,
	}
	cni := libcni.NewCNIConfigWithCacheDir(filepath.SplitList(os.Getenv("CNI_PATH")), os.Getenv("CNI_CACHE_DIR"), nil)
	ctx := context.Background()
	switch verb {
	case "add":
		result, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			fail("%v", err)
		}
		if err := result.Print(); err != nil {
			fail("printing the result: %v", err)
		}
	case "check":
		if err := cni.CheckNetworkList(ctx, list, rt); err != nil {
			fail("%v", err)
		}
	case "del":
		if err := cni.DelNetworkList(ctx, list, rt); err != nil {
			fail("%v", err)
		}
	default:
		fail("unknown command %q (add, check, del)", verb)
	}
}
