// distkit/node.hpp - which ranks share a node, decided once for every distkit package.
//
// Two processes are on one node, and may share POSIX shared memory, only when
// they have the same hostname, the same boot id (/proc/sys/kernel/random/boot_id:
// two machines, or two boots of one machine, never share one) and the same
// /dev/shm (containers on one machine may each mount their own). Hostnames alone
// are not enough (containers and cloud images reuse them), boot ids alone are not
// either (containers, and the simulated cluster's hosts, share the kernel's).
//
// Test switch: a non-empty $DISTKIT_NODE_ID replaces the key, so ranks of one
// machine with different values act as separate nodes (and equal values as one).
// Python reads the same functions (distkit_common.node).
#pragma once

#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace distkit {

/// The environment variable that makes ranks of one machine act as separate nodes (tests).
inline constexpr const char* kNodeIdEnv = "DISTKIT_NODE_ID";

/// $DISTKIT_NODE_ID, or "" when it is unset or empty.
inline std::string node_id_override() {
  const char* v = std::getenv(kNodeIdEnv);
  return v != nullptr ? std::string(v) : std::string();
}

/// This machine's hostname (gethostname), "" if it cannot be read.
inline std::string host_name() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return std::string();
  return std::string(buf);
}

/// Equal on processes that share a node: "<hostname>/<boot id>/<dev>:<inode of /dev/shm>",
/// or "override/<id>" under $DISTKIT_NODE_ID.
inline std::string node_key() {
  const std::string id = node_id_override();
  if (!id.empty()) return "override/" + id;
  std::string boot;
  {
    std::ifstream f("/proc/sys/kernel/random/boot_id");
    std::getline(f, boot);
  }
  const auto end = boot.find_last_not_of(" \t\r\n");
  boot.erase(end == std::string::npos ? 0 : end + 1);
  struct stat st {};
  const std::string shm =
      ::stat("/dev/shm", &st) == 0 ? std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) : std::string();
  return host_name() + "/" + boot + "/" + shm;
}

/// How messages name this node: its hostname, or "node <id>" under $DISTKIT_NODE_ID.
inline std::string node_label() {
  const std::string id = node_id_override();
  return id.empty() ? host_name() : "node " + id;
}

}  // namespace distkit
