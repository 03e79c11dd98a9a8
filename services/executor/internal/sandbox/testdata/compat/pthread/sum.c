/* N threads each sum the squares of their own slice of [0, LIMIT); the
 * main thread joins them and prints the total. Then glibc starts children
 * the two ways programs usually do: posix_spawnp, and system() (which is
 * posix_spawn of /bin/sh inside glibc). */
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define THREADS 4
#define LIMIT 1000000ULL

extern char **environ;

struct part {
	unsigned long long from, sum;
};

static void *work(void *arg)
{
	struct part *p = arg;
	for (unsigned long long k = p->from; k < LIMIT; k += THREADS)
		p->sum += k * k;
	return NULL;
}

int main(void)
{
	pthread_t tid[THREADS];
	struct part parts[THREADS];
	unsigned long long total = 0;
	for (int i = 0; i < THREADS; i++) {
		parts[i] = (struct part){.from = i};
		int err = pthread_create(&tid[i], NULL, work, &parts[i]);
		if (err) {
			fprintf(stderr, "pthread_create: %s\n", strerror(err));
			return 1;
		}
	}
	for (int i = 0; i < THREADS; i++) {
		pthread_join(tid[i], NULL);
		total += parts[i].sum;
	}
	printf("pthreads sum=%llu\n", total);
	fflush(stdout);

	pid_t pid;
	char *argv[] = {"echo", "posix_spawnp child", "ran", NULL};
	int err = posix_spawnp(&pid, "echo", NULL, NULL, argv, environ);
	if (err) {
		fprintf(stderr, "posix_spawnp: %s\n", strerror(err));
		return 1;
	}
	int st;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		fprintf(stderr, "posix_spawnp child: status %#x\n", st);
		return 1;
	}
	st = system("echo system child ran with $((6 * 7))");
	if (st != 0) {
		fprintf(stderr, "system: status %#x\n", st);
		return 1;
	}
	return 0;
}
