/* cni-noop-c: the benchmark's noop plugin in C, linked statically (`make
 * bench`: cc -O2 -static). The same contract as cni-noop (src/main.rs):
 * ADD prints the config's top-level "prevResult" byte for byte, or a
 * minimal result of its "cniVersion"; VERSION prints the supported
 * versions; DEL, CHECK, STATUS, GC print nothing. No sleepMs, no
 * CNI_NOOP_FAIL: it is only the floor of a plugin's cost, a process start
 * without a dynamic loader or a language runtime, which the ratios of
 * cnitool's fixed cost are judged against (BENCHMARKS.md). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char buf[1 << 20];

/* The end of the JSON value starting at p (a string, object, array or
 * scalar), or NULL. */
static const char *skip_value(const char *p, const char *end) {
    int depth = 0;
    for (; p < end; p++) {
        char c = *p;
        if (c == '"') {
            for (p++; p < end && *p != '"'; p++)
                if (*p == '\\') p++;
            if (p >= end) return NULL;
            if (depth == 0) return p + 1;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            if (--depth == 0) return p + 1;
            if (depth < 0) return p;
        } else if (depth == 0 && (c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '\r')) {
            return p;
        }
    }
    return depth == 0 ? p : NULL;
}

static const char *ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r')) p++;
    return p;
}

/* Finds the top-level key `key`: its value's [start, end). */
static int find(const char *in, size_t n, const char *key, const char **vs, const char **ve) {
    const char *p = ws(in, in + n), *end = in + n;
    size_t kl = strlen(key);
    if (p >= end || *p != '{') return 0;
    p++;
    for (;;) {
        p = ws(p, end);
        if (p >= end || *p != '"') return 0;
        const char *ks = p + 1, *ke = skip_value(p, end);
        if (!ke) return 0;
        p = ws(ke, end);
        if (p >= end || *p != ':') return 0;
        p = ws(p + 1, end);
        const char *v = p, *e = skip_value(p, end);
        if (!e) return 0;
        if ((size_t)(ke - 1 - ks) == kl && !memcmp(ks, key, kl)) {
            *vs = v;
            *ve = e;
            return 1;
        }
        p = ws(e, end);
        if (p < end && *p == ',') p++;
        else return 0;
    }
}

static void out(const char *s, size_t n) {
    while (n > 0) {
        ssize_t w = write(1, s, n);
        if (w <= 0) _exit(1);
        s += w;
        n -= (size_t)w;
    }
}
#define OUT(s) out(s, sizeof(s) - 1)

int main(void) {
    size_t n = 0;
    ssize_t r;
    while (n < sizeof buf && (r = read(0, buf + n, sizeof buf - n)) > 0) n += (size_t)r;
    const char *cmd = getenv("CNI_COMMAND");
    if (!cmd) cmd = "";
    const char *vs, *ve, *ps, *pe;
    int has_version = find(buf, n, "cniVersion", &vs, &ve) && *vs == '"';
    if (!strcmp(cmd, "VERSION")) {
        OUT("{\"cniVersion\":");
        if (has_version) out(vs, (size_t)(ve - vs));
        else OUT("\"0.1.0\"");
        OUT(",\"supportedVersions\":[\"0.1.0\",\"0.2.0\",\"0.3.0\",\"0.3.1\",\"0.4.0\",\"1.0.0\",\"1.1.0\"]}");
        return 0;
    }
    if (!strcmp(cmd, "DEL") || !strcmp(cmd, "CHECK") || !strcmp(cmd, "STATUS") || !strcmp(cmd, "GC"))
        return 0;
    if (strcmp(cmd, "ADD")) {
        OUT("{\"code\":4,\"msg\":\"unknown CNI_COMMAND\"}");
        return 1;
    }
    if (find(buf, n, "prevResult", &ps, &pe)) {
        out(ps, (size_t)(pe - ps));
        return 0;
    }
    /* Names from the runtime are printed as they came (no escaping: the
     * benchmark's are plain). */
    const char *ifname = getenv("CNI_IFNAME"), *netns = getenv("CNI_NETNS");
    int old = !has_version || !strncmp(vs, "\"0.1", 4) || !strncmp(vs, "\"0.2", 4);
    OUT("{\"cniVersion\":");
    if (has_version) out(vs, (size_t)(ve - vs));
    else OUT("\"0.1.0\"");
    if (old) {
        OUT(",\"ip4\":{\"ip\":\"10.255.0.2/24\"},\"dns\":{}}");
        return 0;
    }
    OUT(",\"interfaces\":[{\"name\":\"");
    out(ifname ? ifname : "eth0", strlen(ifname ? ifname : "eth0"));
    OUT("\",\"sandbox\":\"");
    out(netns ? netns : "", strlen(netns ? netns : ""));
    OUT("\"}],\"ips\":[{");
    if (!strncmp(vs, "\"0.", 3)) OUT("\"version\":\"4\",");
    OUT("\"interface\":0,\"address\":\"10.255.0.2/24\"}],\"dns\":{}}");
    return 0;
}
