/* step_count.c — counts the instructions a program executes between its first two SIGSTOPs, by single-stepping it
 * with ptrace on the real CPU (so any ISA counts, AVX-512 included, where valgrind 3.19 has no emulation). Used
 * with kernel_instr (KI_STOP=1 makes it stop just before and just after run_kernel):
 *   step_count build/kernel_instr vnni q4_k 16
 * prints the count; subtract the count for REPS = 0 (the raise() in between) and divide by REPS * 16 for
 * instructions per 256 weights. Linux x86-64 only. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: step_count PROGRAM [ARGS...]\n");
        return 2;
    }
    setenv("KI_STOP", "1", 1);
    const pid_t pid = fork();
    if (pid == 0) {
        ptrace(PTRACE_TRACEME, 0, NULL, NULL);
        execv(argv[1], argv + 1);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0); /* the exec's SIGTRAP */
    for (;;) {            /* run to the first SIGSTOP */
        if (ptrace(PTRACE_CONT, pid, NULL, NULL) < 0) return 1;
        waitpid(pid, &st, 0);
        if (!WIFSTOPPED(st)) return 1;
        if (WSTOPSIG(st) == SIGSTOP) break;
    }
    unsigned long long n = 0;
    for (;;) {
        if (ptrace(PTRACE_SINGLESTEP, pid, NULL, NULL) < 0) return 1;
        waitpid(pid, &st, 0);
        if (!WIFSTOPPED(st)) return 1;
        if (WSTOPSIG(st) == SIGSTOP) break;
        n++;
    }
    printf("%llu\n", n);
    ptrace(PTRACE_CONT, pid, NULL, NULL);
    waitpid(pid, &st, 0);
    return 0;
}
