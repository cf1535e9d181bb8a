// A container runtime's use of containerd's go-cni, for cnid's tests: the
// calls containerd's CRI plugin makes for a pod sandbox (cni.New with the
// loopback and the default network, Setup, Check, Remove, with the pod's
// labels as CNI_ARGS and the portMappings and bandwidth capabilities),
// over many sandboxes at a bounded parallelism.
//
//	gocni -conf-dir D -plugin-dir P -cache-dir C -phase setup|check|remove|cycle \
//	      [-parallel N] [-host-ip IP] ID=NETNS...
//
// "cycle" runs Setup, Check and Remove of each sandbox in turn. Prints one
// JSON object: per sandbox its eth0 addresses, the time of each call and
// the first error; the wall time; and the CPU time of this process and of
// the plugins it reaped (getrusage). Exits 1 if any call failed.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	gocni "github.com/containerd/go-cni"
	"github.com/containernetworking/cni/libcni"
)

type sandbox struct {
	ID      string             `json:"id"`
	Netns   string             `json:"netns"`
	IPs     []string           `json:"ips,omitempty"`
	Millis  map[string]float64 `json:"ms"`
	Error   string             `json:"error,omitempty"`
	Started time.Time          `json:"-"`
}

type report struct {
	Sandboxes []*sandbox `json:"sandboxes"`
	WallMs    float64    `json:"wallMs"`
	Failed    int        `json:"failed"`
	// User + system CPU, ms: this process, and its reaped children (the
	// plugins it ran).
	CPUSelfMs     float64 `json:"cpuSelfMs"`
	CPUChildrenMs float64 `json:"cpuChildrenMs"`
}

// The host IP of the sandboxes' port mapping.
var hostIP = "127.0.0.1"

// User + system CPU of `who`, ms.
func cpuMs(who int) float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(who, &ru); err != nil {
		return -1
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e6
}

// The options containerd's CRI plugin passes for a sandbox.
func podOpts(id string) []gocni.NamespaceOpts {
	labels := map[string]string{
		"K8S_POD_NAMESPACE":          "default",
		"K8S_POD_NAME":               "pod-" + id,
		"K8S_POD_INFRA_CONTAINER_ID": id,
		"K8S_POD_UID":                "uid-" + id,
		"IgnoreUnknown":              "1",
	}
	return []gocni.NamespaceOpts{
		gocni.WithLabels(labels),
		gocni.WithCapability("io.kubernetes.cri.pod-annotations", map[string]string{"example.com/pod": id}),
		gocni.WithCapabilityPortMap([]gocni.PortMapping{{HostPort: 8080, ContainerPort: 80, Protocol: "tcp", HostIP: hostIP}}),
		gocni.WithCapabilityBandWidth(gocni.BandWidth{IngressRate: 1000000, IngressBurst: 100000, EgressRate: 2000000, EgressBurst: 200000}),
	}
}

func main() {
	confDir := flag.String("conf-dir", "/etc/cni/net.d", "the runtime's conf dir")
	pluginDir := flag.String("plugin-dir", "/opt/cni/bin", "plugin dirs, ':'-separated")
	cacheDir := flag.String("cache-dir", "", "libcni's cache dir (default /var/lib/cni)")
	phase := flag.String("phase", "cycle", "setup, check, remove or cycle")
	parallel := flag.Int("parallel", 1, "sandboxes at once")
	flag.StringVar(&hostIP, "host-ip", hostIP, "the host IP of the port mapping")
	flag.Parse()
	if *cacheDir != "" {
		libcni.CacheDir = *cacheDir
	}
	// As containerd's CRI plugin: loopback plus the default network.
	cni, err := gocni.New(
		gocni.WithMinNetworkCount(2),
		gocni.WithPluginConfDir(*confDir),
		gocni.WithPluginMaxConfNum(1),
		gocni.WithPluginDir(strings.Split(*pluginDir, ":")),
	)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gocni: New: %v\n", err)
		os.Exit(1)
	}
	if err := cni.Load(gocni.WithLoNetwork, gocni.WithDefaultConf); err != nil {
		fmt.Fprintf(os.Stderr, "gocni: Load: %v\n", err)
		os.Exit(1)
	}
	// go-cni's Check also CHECKs the loopback list, which is 0.3.1 and so
	// has no CHECK (containerd's CRI plugin never calls Check): the pod
	// network is checked through an instance without the loopback.
	checker, err := gocni.New(
		gocni.WithMinNetworkCount(1),
		gocni.WithPluginConfDir(*confDir),
		gocni.WithPluginMaxConfNum(1),
		gocni.WithPluginDir(strings.Split(*pluginDir, ":")),
	)
	if err == nil {
		err = checker.Load(gocni.WithDefaultConf)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "gocni: the checking instance: %v\n", err)
		os.Exit(1)
	}
	var rep report
	for _, arg := range flag.Args() {
		kv := strings.SplitN(arg, "=", 2)
		if len(kv) != 2 {
			fmt.Fprintf(os.Stderr, "gocni: sandbox %q is not ID=NETNS\n", arg)
			os.Exit(2)
		}
		rep.Sandboxes = append(rep.Sandboxes, &sandbox{ID: kv[0], Netns: kv[1], Millis: map[string]float64{}})
	}
	phases := []string{*phase}
	if *phase == "cycle" {
		phases = []string{"setup", "check", "remove"}
	}
	ctx := context.Background()
	work := make(chan *sandbox)
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < *parallel; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for sb := range work {
				for _, p := range phases {
					t := time.Now()
					var err error
					switch p {
					case "setup":
						var res *gocni.Result
						res, err = cni.Setup(ctx, sb.ID, sb.Netns, podOpts(sb.ID)...)
						if err == nil {
							if cfg, ok := res.Interfaces["eth0"]; ok {
								for _, ip := range cfg.IPConfigs {
									sb.IPs = append(sb.IPs, ip.IP.String())
								}
							}
						}
					case "check":
						err = checker.Check(ctx, sb.ID, sb.Netns, podOpts(sb.ID)...)
					case "remove":
						err = cni.Remove(ctx, sb.ID, sb.Netns, podOpts(sb.ID)...)
					default:
						err = fmt.Errorf("unknown phase %q", p)
					}
					sb.Millis[p] = float64(time.Since(t).Microseconds()) / 1000
					if err != nil {
						sb.Error = fmt.Sprintf("%s: %v", p, err)
						break
					}
				}
			}
		}()
	}
	for _, sb := range rep.Sandboxes {
		work <- sb
	}
	close(work)
	wg.Wait()
	rep.WallMs = float64(time.Since(start).Microseconds()) / 1000
	rep.CPUSelfMs = cpuMs(syscall.RUSAGE_SELF)
	rep.CPUChildrenMs = cpuMs(syscall.RUSAGE_CHILDREN)
	for _, sb := range rep.Sandboxes {
		if sb.Error != "" {
			rep.Failed++
		}
		sort.Strings(sb.IPs)
	}
	out, _ := json.Marshal(rep)
	fmt.Println(string(out))
	if rep.Failed > 0 {
		os.Exit(1)
	}
}
