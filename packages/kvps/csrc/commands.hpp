// commands.hpp - what a rank's threads hand each other: a worker's commands to the
// progress thread, operations waiting for a key on its way here, intent windows and
// the rounds they take effect in (intent.hpp).
#pragma once

#include <cstdint>
#include <vector>

namespace kvps {

/// use_techniques (exported to Python as TECHNIQUES).
enum Technique : int { T_ALL = 0, T_REPL_ONLY = 1, T_RELOC_ONLY = 2, T_NONE = 3 };

/// Work a worker hands to the progress thread.
enum CmdType : int32_t {
  C_ROUTE = 100,  // send a pull/push/set (`op`) of keys held elsewhere to their owners
  C_LOCALIZE,     // relocate keys here now
  C_KEEP,         // localize of keys held here already: they stay here (K_KEEP)
  C_INTENT,       // an intent window [a, b) of a worker
  C_CLOCK,        // a worker advanced its clock to a: activate intents, maybe refresh replicas
  C_SYNC,         // wait_sync: a sync round; done when every internal operation finished
  C_RESET,        // every key back to its home (load)
  C_DUMP,         // print what the engine waits for (a stalled wait)
  C_BYE,          // tell every peer this rank leaves without shutdown()
};

struct Cmd {
  int32_t type = 0;
  int32_t op = 0;  // C_ROUTE: M_PULL / M_PUSH / M_SET
  int64_t ts = -1;
  int worker = 0;
  int64_t a = 0, b = 0;
  std::vector<int64_t> keys, pos;
  std::vector<char> vals;
};

/// An operation on a key that is on its way here, replayed when it arrives.
struct PendingOp {
  int32_t type;
  int32_t origin;
  int64_t ts;
  int64_t pos;
  std::vector<char> val;
};

/// A PendingOp type that is no message: the key comes back here after the
/// transfer queued before it (relocation.hpp, queue_return).
constexpr int32_t kReturnMarker = -1;

struct IntentEntry {
  int64_t start, end;
  std::vector<int64_t> keys;
};

/// Intents take effect in rounds every this many clocks (intent.hpp): with
/// peers on other nodes a quarter of the lookahead, so an intent still takes
/// effect at least three quarters of the lookahead before its window; every
/// clock on one node (messages are cheap there and a round's burst of moves
/// delays the workers' requests) and for short lookaheads (< 8), which leave
/// no slack to spend.
inline int64_t intent_round_of(int64_t lookahead, bool one_node) {
  return !one_node && lookahead >= 8 ? lookahead / 4 : 1;
}

}  // namespace kvps
