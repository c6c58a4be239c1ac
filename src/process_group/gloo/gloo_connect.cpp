#include "process_group/gloo/gloo_connect.h"

#include <algorithm>
#include <future>
#include <new>
#include <optional>
#include <stdexcept>
#include <thread>

#include "common/error_context.h"
#include "common/peer_directory.h"
#include "common/store_text.h"
#include "process_group/gloo/gloo_peers.h"
#include "process_group/gloo/releasable_store.h"
#include "process_group/process_state.h"

namespace ddp::detail {
namespace {

constexpr auto kConnectAllowance = std::chrono::seconds(5);
constexpr auto kLookEvery = std::chrono::milliseconds(250);
// How long group rank 0 waits for the others to give up too (they look every kLookEvery); with
// kConnectAllowance, every failure to make the group is reported within the timeout + 8 s.
constexpr auto kWaitForTheOthers = std::chrono::seconds(3);
// How long a member whose gloo connections failed waits for the note of the member that gave up
// first, which says why (it leaves one within milliseconds of closing its connections).
constexpr auto kWaitForACause = std::chrono::seconds(1);

// A member's note when it gave up: "LOST <identity text>" when it knew which member was lost,
// "TIMEOUT <its error>" when it gave up waiting, "STORE <its error>" when what the store held
// could not be used, "WHY <its error>" otherwise.
std::string note_key(int group_rank) { return "ddp_gave_up/" + std::to_string(group_rank); }
// How many notes there are: one request tells whether there is any new one to read.
const std::string kNoteCountKey = "ddp_gave_up_count";
const std::string kLost = "LOST ";
const std::string kTimeout = "TIMEOUT ";
const std::string kWhy = "WHY ";
const std::string kStore = "STORE ";

// While gloo makes a group, the only data it parses is what the members published in the store:
// gloo asserts on an address of the wrong size, and a length read from bytes that are no address
// asks for an impossible string (std::length_error) or allocation.
bool could_not_read_an_address(const std::exception& error) {
  return dynamic_cast<const std::length_error*>(&error) != nullptr ||
         dynamic_cast<const std::bad_alloc*>(&error) != nullptr ||
         std::string(error.what()).find("gloo/transport/tcp/address.cc") != std::string::npos;
}

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

// What this member knows of the others while the group is being made. Every request to the
// store may fail once the store's host (group rank 0) has exited: what is known then stays.
class MemberWatch {
 public:
  MemberWatch(c10d::Store& store, int group_rank, int group_size, std::string operation)
      : store_(store),
        me_(group_rank),
        members_(group_size),
        operation_(std::move(operation)),
        notes_(group_size) {}

  // Throws what this member should report now, once it has left its own note: a member that
  // another one found lost, a member that exited on this host without a note (it crashed, or
  // was killed), or what a member that exited after it gave up said. A member that gave up for
  // a reason of its own (a timeout, which every member meets at about the same time) is not
  // followed while it is there: each member makes its own diagnosis of such a failure.
  void look() {
    read_new_arrivals();
    if (new_notes()) {
      for (int member = 0; member < size(); ++member) {
        if (member == me_) continue;
        auto note = note_of(member);
        if (note && starts_with(*note, kLost)) report(member, *note);
      }
    }
    for (int member = 0; member < size(); ++member) {
      if (member == me_ || !members_[member].known_to_have_exited()) continue;
      // It may have left a note just before it exited, after the loop above read it.
      if (auto note = note_of(member)) report(member, *note);
      leave_note(kLost + members_[member].text());
      fail_peer_lost(operation_,
                     members_[member].describe() +
                         " exited after it arrived, while the gloo group was being made: its "
                         "own output says why.",
                     members_[member].rank, members_[member].host);
    }
  }

  // The other members known to be stopped, for the start of a message (describe_stopped).
  std::string stopped() const {
    std::vector<PeerIdentity> others;
    for (int member = 0; member < size(); ++member) {
      if (member != me_ && members_[member].pid != 0) others.push_back(members_[member]);
    }
    return describe_stopped(others);
  }

  // The other members that said who they are, for a message.
  std::string others() const {
    std::string list;
    for (int member = 0; member < size(); ++member) {
      if (member == me_ || members_[member].pid == 0) continue;
      list += (list.empty() ? "" : ", ") + members_[member].describe();
    }
    return list;
  }

  void leave_note(const std::string& note) {
    if (noted_) return;
    noted_ = true;
    try {
      store_.set(note_key(me_), bytes_of(note));
      store_.add(kNoteCountKey, 1);
    } catch (const std::exception&) {
      // The store is gone: nobody is left to read it.
    }
  }

  // Throws a cause that another member gave in its note (see look(), and report()) or found,
  // waiting up to `patience` for one; returns when none came.
  void wait_for_a_cause(std::chrono::milliseconds patience) {
    const auto deadline = std::chrono::steady_clock::now() + patience;
    for (;;) {
      look();
      for (int member = 0; member < size(); ++member) {
        if (member == me_) continue;
        auto note = note_of(member);
        if (note && (starts_with(*note, kWhy) || starts_with(*note, kStore))) {
          report(member, *note);
        }
      }
      if (std::chrono::steady_clock::now() >= deadline) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // Group rank 0 hosts the store: before it reports (and its program most likely exits), it
  // gives the other members up to kWaitForTheOthers to read the notes and leave their own.
  void wait_for_the_others_to_give_up() {
    if (me_ != 0) return;
    const auto deadline = std::chrono::steady_clock::now() + kWaitForTheOthers;
    while (std::chrono::steady_clock::now() < deadline) {
      read_new_arrivals();
      bool all_done = true;
      for (int member = 1; member < size() && all_done; ++member) {
        all_done = members_[member].pid == 0 || members_[member].known_to_have_exited() ||
                   note_of(member).has_value();
      }
      if (all_done) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

 private:
  int size() const { return static_cast<int>(members_.size()); }

  void read_new_arrivals() {
    for (int member = 0; member < size(); ++member) {
      if (members_[member].pid != 0) continue;
      try {
        if (store_.check({arrival_key(member)})) {
          members_[member] = PeerIdentity::parse(text_of(store_.get(arrival_key(member))));
        }
      } catch (const std::exception&) {
        return;
      }
    }
  }

  // True when members left notes since the last call.
  bool new_notes() {
    try {
      const int64_t count = store_.add(kNoteCountKey, 0);
      if (count == notes_counted_) return false;
      notes_counted_ = count;
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }

  // A member's note, kept once read: the store goes when group rank 0 exits.
  std::optional<std::string> note_of(int member) {
    if (notes_[member]) return notes_[member];
    try {
      if (store_.check({note_key(member)})) notes_[member] = text_of(store_.get(note_key(member)));
    } catch (const std::exception&) {
    }
    return notes_[member];
  }

  [[noreturn]] void report(int member, const std::string& note) {
    const std::string finder = members_[member].pid != 0 ? members_[member].describe()
                                                         : "group rank " + std::to_string(member);
    leave_note(note);
    if (starts_with(note, kLost)) {
      const auto lost = PeerIdentity::parse(note.substr(kLost.size()));
      fail_peer_lost(operation_,
                     lost.describe() +
                         " exited after it arrived, while the gloo group was being made (" +
                         finder + " found it): its own output says why.",
                     lost.rank, lost.host);
    }
    const std::string cause = finder +
                              " gave up making the gloo group and exited, so this rank cannot "
                              "make it either. It said: ";
    if (starts_with(note, kTimeout)) {
      fail<TimeoutError>(operation_, cause + note.substr(kTimeout.size()));
    }
    if (starts_with(note, kStore)) fail<StoreError>(operation_, cause + note.substr(kStore.size()));
    fail<DistributedError>(operation_, cause + note.substr(kWhy.size()));
  }

  c10d::Store& store_;
  const int me_;
  std::vector<PeerIdentity> members_;  // pid 0: not arrived yet (or a Python rank)
  const std::string operation_;
  bool noted_ = false;
  std::vector<std::optional<std::string>> notes_;  // by member, once read
  int64_t notes_counted_ = 0;
};

// Who each arrived group rank said it is; pid 0 for the others (Python ranks say nothing).
std::vector<PeerIdentity> members_that_arrived(c10d::Store& store, int group_size) {
  std::vector<PeerIdentity> members(group_size);
  for (int rank = 0; rank < group_size; ++rank) {
    if (store.check({arrival_key(rank)})) {
      members[rank] = PeerIdentity::parse(text_of(store.get(arrival_key(rank))));
    }
  }
  return members;
}

}  // namespace

std::string arrival_key(int group_rank) { return "ddp_arrived/" + std::to_string(group_rank); }

c10::intrusive_ptr<GlooWithConnections> connect_gloo_group(
    const c10::intrusive_ptr<c10d::Store>& store, int group_rank, int group_size,
    const c10::intrusive_ptr<c10d::ProcessGroupGloo::Options>& options,
    std::chrono::milliseconds timeout, const std::string& operation) {
  store->set(arrival_key(group_rank),
             bytes_of(PeerIdentity::of_this_process(current_global_rank()).text()));
  auto made = std::make_shared<std::promise<c10::intrusive_ptr<GlooWithConnections>>>();
  auto group = made->get_future();
  auto releasable = c10::make_intrusive<ReleasableStore>(store);
  std::thread([made, releasable, group_rank, group_size, options, timeout, operation] {
    try {
      auto group =
          c10::make_intrusive<GlooWithConnections>(releasable, group_rank, group_size, options);
      learn_gloo_peers(group->connections(), *releasable, group_rank,
                       members_that_arrived(*releasable, group_size), timeout, operation);
      made->set_value(std::move(group));
    } catch (...) {
      made->set_exception(std::current_exception());
    }
  }).detach();
  const auto deadline = std::chrono::steady_clock::now() + timeout + kConnectAllowance;
  // Every member's look costs the store a request or two: large groups look less often.
  const auto look_every = kLookEvery * std::max(1, group_size / 16);
  MemberWatch watch(*store, group_rank, group_size, operation);
  try {
    while (group.wait_for(look_every) != std::future_status::ready) {
      watch.look();
      if (std::chrono::steady_clock::now() < deadline) continue;
      const std::string within = "gloo did not connect the group within " +
                                 std::to_string((timeout + kConnectAllowance).count()) +
                                 " ms (the timeout and " +
                                 std::to_string(kConnectAllowance.count()) + " s to connect)";
      const std::string stopped = watch.stopped();
      if (!stopped.empty()) fail<TimeoutError>(operation, within + ": " + stopped);
      const std::string others = watch.others();
      fail<TimeoutError>(
          operation,
          within +
              ": a rank stopped, or exited on another host, after it arrived. Look at the output "
              "of the other ranks" +
              (others.empty() ? std::string() : " (" + others + ")") +
              "; if all of them are still running, a firewall may block gloo's ports between "
              "hosts, or a process that is not one of the job's ranks changed the addresses in "
              "the store (its port must not be reachable by untrusted processes).");
    }
    try {
      return group.get();
    } catch (const std::exception& error) {
      // A member found lost explains gloo's error best. So does the note of a member that gave
      // up for a reason of its own: its connections closed when it gave up, a moment before it
      // left the note, and gloo reports that in many words ("Connection refused", "Connection
      // reset by peer", 2.x's "connectFullMesh failed with ... no error"). Only a timeout, which
      // every member meets, an address this member could not read, which it explains itself,
      // and what this member's own code already classified, are its own to report at once.
      const std::string what = error.what();
      if (dynamic_cast<const DistributedError*>(&error) == nullptr && !reports_a_timeout(what) &&
          !could_not_read_an_address(error)) {
        watch.wait_for_a_cause(kWaitForACause);
      }
      watch.look();
      if (could_not_read_an_address(error)) {
        fail<StoreError>(operation,
                         "gloo could not read an address that a rank published in the store (" +
                             what.substr(0, what.find('\n')) +
                             "): a process that is not one of the job's ranks wrote over it (the "
                             "store authenticates nobody: its port must be reachable by the "
                             "job's ranks only), or the ranks run different builds of gloo.");
      }
      throw;
    }
  } catch (const std::exception& error) {
    const std::string what = error.what();
    const bool timed_out =
        dynamic_cast<const TimeoutError*>(&error) != nullptr || reports_a_timeout(what);
    // The first line: c10's errors carry a backtrace after it.
    const std::string& kind = timed_out                                            ? kTimeout
                              : dynamic_cast<const StoreError*>(&error) != nullptr ? kStore
                                                                                   : kWhy;
    watch.leave_note(kind + what.substr(0, what.find('\n')));
    watch.wait_for_the_others_to_give_up();
    releasable->release();  // the thread left behind must not keep the store (and its port)
    throw;
  }
}

}  // namespace ddp::detail
