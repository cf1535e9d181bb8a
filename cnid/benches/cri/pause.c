/* The CRI benchmark's sandbox image: what the `pause` container does,
 * nothing more. It sleeps until SIGINT or SIGTERM and exits 0, and reaps
 * any child it inherits as PID 1 of the pod. Built statically so the image
 * holds one file. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void quit(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
}

int main(void) {
	struct sigaction q = {.sa_handler = quit};
	struct sigaction r = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
	sigaction(SIGINT, &q, NULL);
	sigaction(SIGTERM, &q, NULL);
	sigaction(SIGCHLD, &r, NULL);
	for (;;)
		pause();
	return 0;
}
