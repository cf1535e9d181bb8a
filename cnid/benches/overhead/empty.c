/* An empty program: what any process start costs on the machine (exec,
 * exit, reap, no libraries). Built static by `make bench` (cni-empty-c),
 * the reference of cnid-shim's start-up. */
int main(void) { return 0; }
