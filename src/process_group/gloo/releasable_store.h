// A store that can be cut off from the store it forwards to.
//
// gloo's group is made on a thread of its own (gloo_connect.h), which init leaves behind when it
// gives up: that thread ends only when gloo does, up to five times the timeout later. Were it to
// hold the job's store until then, rank 0's store server, and its port, would outlive the failed
// init_process_group, and a program that tries again on the same port would find it taken. The
// thread is given this store instead. release() drops the store it forwards to: every later
// request fails, a wait in progress (which polls) ends within milliseconds, and the store itself
// goes once the requests in flight have ended.
//
// Only the basic requests are forwarded (hasExtendedApi() is false): gloo then reads the members'
// addresses one key at a time, the same keys its batched requests would read.
// Thread-safe.
#pragma once

#include <mutex>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace ddp::detail {

class ReleasableStore : public c10d::Store {
 public:
  explicit ReleasableStore(c10::intrusive_ptr<c10d::Store> store);

  /// From now on every request fails; the store forwarded to is no longer held.
  void release();

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;
  /// A store for another thread (c10d::Store::clone, pure since libtorch 2.15; gloo's group takes
  /// one per connection): a ReleasableStore over the forwarded store's clone, released with this.
  c10::intrusive_ptr<c10d::Store> clone();

 private:
  c10::intrusive_ptr<c10d::Store> forwarded() const;  // throws once released

  mutable std::mutex mutex_;
  c10::intrusive_ptr<c10d::Store> store_;  // guarded by mutex_; empty once released
  std::vector<c10::weak_intrusive_ptr<ReleasableStore>> clones_;  // guarded by mutex_
};

}  // namespace ddp::detail
