// Death tests for Catch2 v2 (which has none): run code in a forked child and look at how it ended.
// A Catch2 helper (it REQUIREs that fork, pipe and wait work). POSIX only.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <string>
#include <utility>

#include <catch2/catch.hpp>

namespace refpool::test {

// Runs `f` in a child process with stderr captured; returns (terminated by SIGABRT, stderr).
template <class F>
std::pair<bool, std::string> in_child(F&& f) {
  int pipe_fds[2];
  REQUIRE(pipe(pipe_fds) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    dup2(pipe_fds[1], STDERR_FILENO);
    // Catch2's handler would report the abort as a failure of the test (on the child's stdout)
    // and, under TSan, make signal-unsafe calls: the child dies of the plain signal instead.
    std::signal(SIGABRT, SIG_DFL);
    f();
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string output;
  char buffer[512];
  for (ssize_t n; (n = read(pipe_fds[0], buffer, sizeof buffer)) > 0;)
    output.append(buffer, static_cast<std::size_t>(n));
  close(pipe_fds[0]);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  return {WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, output};
}

}  // namespace refpool::test
