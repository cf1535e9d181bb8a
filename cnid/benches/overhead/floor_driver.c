/*
 * The floor as a process (the "static C driver"): the least a
 * runtime that is a program of its own must do to run a chain. `make bench`
 * builds it with `$(CC) -O2 -static` (as cni-noop-c); the overhead
 * benchmark runs it like cnitool, in the same loops.
 *
 *   cni-floor-c PLAN [RESULT]
 *
 * PLAN (written by the benchmark, `floor.rs`) holds one step per plugin,
 * four lines each: the plugin's path; how `prevResult` is filled ("-" none,
 * "P" the previous plugin's stdout, "R" the RESULT file's bytes); the stdin
 * before `prevResult`; the stdin after it (compact JSON: no newline inside).
 * Per step: one posix_spawn (stdin and stdout piped, stderr to /dev/null,
 * the driver's own environment: the benchmark gives it the plugin's CNI_*
 * variables), one writev of the stdin, a read of stdout to EOF, a waitpid.
 * The last plugin's stdout is printed. No JSON is parsed, nothing is cached,
 * no deadline, no process group: as the in-process floor, plus the cost of
 * being a process.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define MAX_STEPS 64

struct step {
	char *path;
	char mode;
	char *head;
	size_t head_len;
	char *tail;
	size_t tail_len;
};

static void die(const char *what, const char *arg)
{
	fprintf(stderr, "cni-floor-c: %s %s: %s\n", what, arg ? arg : "",
		errno ? strerror(errno) : "bad input");
	exit(1);
}

/* The whole file at `path`, NUL-terminated; its length in *len. */
static char *slurp(const char *path, size_t *len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		die("open", path);
	size_t cap = 4096, n = 0;
	char *buf = malloc(cap);
	for (;;) {
		if (n + 1 >= cap) {
			cap *= 2;
			buf = realloc(buf, cap);
		}
		ssize_t r = read(fd, buf + n, cap - n - 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			die("read", path);
		if (r == 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	buf[n] = 0;
	*len = n;
	return buf;
}

/* The next line of *cursor (its newline replaced by NUL). */
static char *line(char **cursor, size_t *len)
{
	char *start = *cursor;
	char *nl = strchr(start, '\n');
	if (!nl) {
		errno = 0;
		die("plan: a step is cut short", NULL);
	}
	*nl = 0;
	*len = (size_t)(nl - start);
	*cursor = nl + 1;
	return start;
}

/* Writes all of iov (advancing it), retrying short writes. */
static void write_all(int fd, struct iovec *iov, int n, const char *path)
{
	while (n > 0) {
		ssize_t w = writev(fd, iov, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			die("writing the stdin of", path);
		while (n > 0 && (size_t)w >= iov->iov_len) {
			w -= (ssize_t)iov->iov_len;
			iov++;
			n--;
		}
		if (n > 0) {
			iov->iov_base = (char *)iov->iov_base + w;
			iov->iov_len -= (size_t)w;
		}
	}
}

/* Runs one step; its stdout into *out (length *out_len, capacity *out_cap). */
static void run(const struct step *s, const char *prev, size_t prev_len,
		char **out, size_t *out_len, size_t *out_cap)
{
	int in[2], res[2];
	if (pipe2(in, O_CLOEXEC) || pipe2(res, O_CLOEXEC))
		die("pipe for", s->path);
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, in[0], 0);
	posix_spawn_file_actions_adddup2(&fa, res[1], 1);
	posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
	char *argv[] = {s->path, NULL};
	pid_t pid;
	int err = posix_spawn(&pid, s->path, &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (err) {
		errno = err;
		die("spawn", s->path);
	}
	close(in[0]);
	close(res[1]);
	struct iovec iov[3] = {
		{s->head, s->head_len},
		{(void *)prev, prev_len},
		{s->tail, s->tail_len},
	};
	write_all(in[1], iov, 3, s->path);
	close(in[1]);
	*out_len = 0;
	for (;;) {
		if (*out_len == *out_cap) {
			*out_cap *= 2;
			*out = realloc(*out, *out_cap);
		}
		ssize_t r = read(res[0], *out + *out_len, *out_cap - *out_len);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			die("reading the stdout of", s->path);
		if (r == 0)
			break;
		*out_len += (size_t)r;
	}
	close(res[0]);
	int status;
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			die("waitpid", s->path);
	if (!WIFEXITED(status) || WEXITSTATUS(status)) {
		fprintf(stderr, "cni-floor-c: %s failed (wait status %#x): %.*s\n",
			s->path, status, (int)*out_len, *out);
		exit(1);
	}
}

int main(int argc, char **argv)
{
	if (argc < 2 || argc > 3) {
		fprintf(stderr, "usage: cni-floor-c PLAN [RESULT]\n");
		return 2;
	}
	size_t plan_len, result_len = 0;
	char *plan = slurp(argv[1], &plan_len);
	char *result = argc == 3 ? slurp(argv[2], &result_len) : NULL;
	struct step steps[MAX_STEPS];
	int n = 0;
	char *cursor = plan;
	while (*cursor) {
		if (n == MAX_STEPS) {
			errno = 0;
			die("plan: more steps than", "64");
		}
		struct step *s = &steps[n++];
		size_t len;
		s->path = line(&cursor, &len);
		s->mode = *line(&cursor, &len);
		s->head = line(&cursor, &s->head_len);
		s->tail = line(&cursor, &s->tail_len);
		if (s->mode == 'R' && !result) {
			errno = 0;
			die("plan: a step wants the RESULT file, not given:", s->path);
		}
	}
	size_t cap = 4096, out_len = 0, prev_len = 0;
	char *out = malloc(cap), *prev = malloc(cap);
	size_t prev_cap = cap;
	for (int i = 0; i < n; i++) {
		const char *mid = NULL;
		size_t mid_len = 0;
		if (steps[i].mode == 'P') {
			mid = prev;
			mid_len = prev_len;
		} else if (steps[i].mode == 'R') {
			mid = result;
			mid_len = result_len;
		}
		run(&steps[i], mid, mid_len, &out, &out_len, &cap);
		/* This output is the next step's previous one. */
		char *t = prev;
		size_t tc = prev_cap;
		prev = out;
		prev_len = out_len;
		prev_cap = cap;
		out = t;
		cap = tc;
	}
	struct iovec iov = {prev, prev_len};
	write_all(1, &iov, 1, "stdout");
	return 0;
}
