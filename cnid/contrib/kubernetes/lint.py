#!/usr/bin/env python3
"""Lints the Containerfile against the DaemonSet and the workspace (make
deploy-check, beside kubernetes-validate's schema check of cnid.yaml):

- every program the DaemonSet runs (container commands, exec probes) is a
  file the image has: copied into /out by the build stage, and /out into
  the final stage's dir;
- every `--bin` the build stage builds is a binary of a package it selects
  with `-p` (cargo metadata), and every `make TARGET` it runs is a target of
  the Makefile;
- every COPY source exists, and every workspace member is inside one (a
  member left out fails the build);
- the Rust image is at least the workspace's rust-version;
- cnid runs where it sees the host's namespaces: the pod has hostPID and
  hostNetwork, and the cnid container mounts the host's netns dir at the
  same path with HostToContainer or Bidirectional propagation (without
  it, a namespace the runtime creates later is not there for cnid, and
  its reaper must never judge on what it cannot see).

Run from the workspace root: `python3 cnid/contrib/kubernetes/lint.py`
(needs PyYAML, which kubernetes-validate brings); `--self-test` checks that
each rule catches a broken copy.
"""

import json
import os
import re
import shlex
import subprocess
import sys

import yaml

HERE = "cnid/contrib/kubernetes"


def logical_lines(text):
    """The Containerfile's instructions: continuation lines joined, comments dropped."""
    out, cur = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") and not cur:
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        if cur.strip():
            out.append(cur.strip())
        cur = ""
    return out


def parse_containerfile(text):
    """Stages as dicts: base image, name, COPY (src list, dest, from), RUN texts."""
    stages = []
    for line in logical_lines(text):
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append({"image": parts[0], "name": name, "copies": [], "runs": []})
        elif word == "COPY":
            args = shlex.split(rest)
            frm = None
            flags = [a for a in args if a.startswith("--")]
            for f in flags:
                if f.startswith("--from="):
                    frm = f.split("=", 1)[1]
            paths = [a for a in args if not a.startswith("--")]
            stages[-1]["copies"].append({"from": frm, "srcs": paths[:-1], "dest": paths[-1]})
        elif word == "RUN":
            stages[-1]["runs"].append(rest)
    return stages


def daemonset_programs(docs):
    """(where, program) for each container command and exec probe."""
    out = []
    for doc in docs:
        if not doc or doc.get("kind") not in ("DaemonSet", "Deployment", "Pod"):
            continue
        spec = doc["spec"]["template"]["spec"] if doc["kind"] != "Pod" else doc["spec"]
        for key in ("initContainers", "containers"):
            for c in spec.get(key, []):
                if c.get("command"):
                    out.append((f"{c['name']}.command", c["command"][0]))
                for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                    cmd = c.get(probe, {}).get("exec", {}).get("command")
                    if cmd:
                        out.append((f"{c['name']}.{probe}", cmd[0]))
    return out


def image_files(stages):
    """Absolute paths the final stage gets from the build stage's /out."""
    build = {s["name"]: s for s in stages if s["name"]}
    final = stages[-1]
    files = set()
    for copy in final["copies"]:
        stage = build.get(copy["from"])
        if stage is None:
            continue
        for src in copy["srcs"]:
            src = src.rstrip("/")
            for run in stage["runs"]:
                # `cp A B ... SRC/`: the basenames of what lands in SRC.
                for part in re.split(r"&&", run):
                    words = shlex.split(part)
                    if words[:1] == ["cp"] and words[-1].rstrip("/") == src:
                        for f in words[1:-1]:
                            if not f.startswith("-"):
                                files.add(os.path.join(copy["dest"], os.path.basename(f)))
    return files


def cargo_builds(run):
    """(packages, bins) of each `cargo build` in a RUN."""
    out = []
    for part in re.split(r"&&|;", run):
        words = shlex.split(part)
        if words[:2] != ["cargo", "build"]:
            continue
        pkgs, bins = [], []
        for i, w in enumerate(words):
            if w in ("-p", "--package"):
                pkgs.append(words[i + 1])
            elif w == "--bin":
                bins.append(words[i + 1])
        out.append((pkgs, bins))
    return out


def make_targets(run):
    return [t for part in re.split(r"&&|;", run) for t in shlex.split(part)[1:2] if shlex.split(part)[:1] == ["make"]]


NETNS_DIR = "/run/netns"


def namespace_problems(docs):
    """Where the DaemonSet would keep cnid from seeing the host's namespaces."""
    problems = []
    for doc in docs:
        if not doc or doc.get("kind") != "DaemonSet":
            continue
        pod = doc["spec"]["template"]["spec"]
        for key, what in (("hostPID", "PIDs (/proc/PID/ns/net paths)"), ("hostNetwork", "network namespace")):
            if pod.get(key) is not True:
                problems.append(f"the DaemonSet lacks {key}: true: cnid must see the host's {what}")
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        runs_cnid = [c for c in pod.get("containers", []) if os.path.basename((c.get("command") or [""])[0]) == "cnid"]
        if not runs_cnid:
            problems.append("no container of the DaemonSet runs cnid")
        for c in runs_cnid:
            mounts = [m for m in c.get("volumeMounts", []) if m.get("mountPath", "").rstrip("/") == NETNS_DIR]
            if not mounts:
                problems.append(f"container {c['name']} does not mount the host's {NETNS_DIR}")
            for m in mounts:
                host = volumes.get(m["name"], {}).get("hostPath", {}).get("path", "").rstrip("/")
                if host != NETNS_DIR:
                    problems.append(f"container {c['name']} mounts {m['name']} at {NETNS_DIR}, which is not the host's {NETNS_DIR} (it is {host or 'no hostPath'})")
                if m.get("mountPropagation") not in ("HostToContainer", "Bidirectional"):
                    problems.append(f"container {c['name']} mounts {NETNS_DIR} without HostToContainer or Bidirectional propagation: namespaces made later would not show up")
    return problems


def version_tuple(v):
    return tuple(int(x) for x in re.findall(r"\d+", v)[:2])


def lint(containerfile, daemonset, metadata, makefile, exists, rust_version):
    """The problems found, as sentences."""
    problems = []
    stages = parse_containerfile(containerfile)
    files = image_files(stages)
    problems += namespace_problems(list(yaml.safe_load_all(daemonset)))
    for where, prog in daemonset_programs(list(yaml.safe_load_all(daemonset))):
        if prog not in files:
            problems.append(f"the DaemonSet's {where} runs {prog}, which the image does not have (it has {sorted(files)})")
    bins = {p["name"]: {t["name"] for t in p["targets"] if "bin" in t["kind"]} for p in metadata["packages"]}
    targets = set(re.findall(r"(?m)^([A-Za-z0-9_.-]+):", makefile))
    for stage in stages:
        for run in stage["runs"]:
            for pkgs, wanted in cargo_builds(run):
                have = set().union(*(bins.get(p, set()) for p in pkgs)) if pkgs else set().union(*bins.values())
                for p in pkgs:
                    if p not in bins:
                        problems.append(f"the Containerfile builds package {p}, which the workspace does not have")
                for b in wanted:
                    if b not in have:
                        problems.append(f"the Containerfile builds --bin {b}, which no package it selects ({', '.join(pkgs)}) has")
            for t in make_targets(run):
                if t not in targets:
                    problems.append(f"the Containerfile runs make {t}, which the Makefile has no target for")
        copied = []
        for copy in stage["copies"]:
            if copy["from"]:
                continue
            for src in copy["srcs"]:
                copied.append(src.rstrip("/"))
                if not exists(src):
                    problems.append(f"the Containerfile copies {src}, which does not exist")
        if stage["name"] == "build":
            root = metadata["workspace_root"]
            for p in metadata["packages"]:
                rel = os.path.relpath(os.path.dirname(p["manifest_path"]), root)
                if not any(rel == c or rel.startswith(c + "/") for c in copied):
                    problems.append(f"workspace member {rel} is not copied into the build stage")
            m = re.search(r"rust:(\d+\.\d+)", stage["image"])
            if m and version_tuple(m.group(1)) < version_tuple(rust_version):
                problems.append(f"the build image {stage['image']} is older than rust-version {rust_version}")
    return problems


def workspace():
    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"],
        check=True, capture_output=True, text=True).stdout)
    cargo_toml = open("Cargo.toml").read()
    rust_version = re.search(r'(?m)^rust-version\s*=\s*"([^"]+)"', cargo_toml).group(1)
    return meta, open("Makefile").read(), rust_version


def main():
    meta, makefile, rust_version = workspace()
    containerfile = open(f"{HERE}/Containerfile").read()
    daemonset = open(f"{HERE}/cnid.yaml").read()
    if sys.argv[1:] == ["--self-test"]:
        return self_test(containerfile, daemonset, meta, makefile, rust_version)
    problems = lint(containerfile, daemonset, meta, makefile, os.path.exists, rust_version)
    for p in problems:
        print(f"lint: {p}", file=sys.stderr)
    if not problems:
        print(f"lint: {HERE}/Containerfile has what {HERE}/cnid.yaml runs, and cnid sees the host's namespaces")
    return 1 if problems else 0


def self_test(containerfile, daemonset, meta, makefile, rust_version):
    """Each rule catches a broken copy of the real files; the real ones pass."""
    ok = lint(containerfile, daemonset, meta, makefile, os.path.exists, rust_version)
    assert ok == [], ok
    broken = [
        ("a program the image lacks", containerfile, daemonset.replace("/usr/local/bin/cnid-shim", "/usr/bin/cnid-shim", 1), "which the image does not have"),
        ("a binary no package has", containerfile.replace("--bin cnid ", "--bin cnitool-daemon ", 1), daemonset, "--bin cnitool-daemon"),
        ("a make target that is gone", containerfile.replace("make shim", "make static-shim"), daemonset, "make static-shim"),
        ("a missing COPY source", containerfile.replace("COPY examples examples", "COPY extras extras"), daemonset, "copies extras"),
        ("a member left out", containerfile.replace("COPY examples examples\n", ""), daemonset, "member examples"),
        ("an old toolchain", re.sub(r"rust:\d+\.\d+", "rust:1.70", containerfile), daemonset, "older than rust-version"),
        ("no hostPID", containerfile, daemonset.replace("hostPID: true", "hostPID: false", 1), "lacks hostPID"),
        ("the netns dir without propagation", containerfile, daemonset.replace("mountPropagation: HostToContainer", "readOnly: false", 1), "without HostToContainer"),
        ("the netns dir not mounted", containerfile, daemonset.replace("mountPath: /run/netns", "mountPath: /var/run/netns-copy", 1), "does not mount the host's /run/netns"),
        ("another dir at the netns path", containerfile, daemonset.replace("path: /run/netns", "path: /var/lib/cnid/netns", 1), "not the host's /run/netns"),
    ]
    for what, cf, ds, needle in broken:
        problems = lint(cf, ds, meta, makefile, os.path.exists, rust_version)
        assert any(needle in p for p in problems), f"{what}: not caught ({problems})"
        print(f"lint self-test: {what}: caught")
    return 0


if __name__ == "__main__":
    sys.exit(main())
