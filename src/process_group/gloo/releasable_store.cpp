#include "process_group/gloo/releasable_store.h"

#include <algorithm>
#include <stdexcept>
#include <thread>

#include "compat/libtorch_compat.h"

namespace ddp::detail {

ReleasableStore::ReleasableStore(c10::intrusive_ptr<c10d::Store> store)
    : c10d::Store(store->getTimeout()), store_(std::move(store)) {}

void ReleasableStore::release() {
  c10::intrusive_ptr<c10d::Store> released;
  std::vector<c10::weak_intrusive_ptr<ReleasableStore>> clones;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    released = std::move(store_);
    clones = std::move(clones_);
  }
  for (auto& weak : clones) {
    if (auto clone = weak.lock()) clone->release();
  }
  // `released` goes here, outside the lock: the last reference closes the store's connections.
}

c10::intrusive_ptr<c10d::Store> ReleasableStore::forwarded() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!store_) throw std::runtime_error("the store was released: init_process_group gave up");
  return store_;
}

c10::intrusive_ptr<c10d::Store> ReleasableStore::clone() {
  auto copy = c10::make_intrusive<ReleasableStore>(compat::clone_store(*forwarded()));
  std::lock_guard<std::mutex> lock(mutex_);
  clones_.emplace_back(copy);
  return copy;
}

void ReleasableStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  forwarded()->set(key, value);
}

std::vector<uint8_t> ReleasableStore::compareSet(const std::string& key,
                                                 const std::vector<uint8_t>& expected,
                                                 const std::vector<uint8_t>& desired) {
  return forwarded()->compareSet(key, expected, desired);
}

std::vector<uint8_t> ReleasableStore::get(const std::string& key) { return forwarded()->get(key); }

int64_t ReleasableStore::add(const std::string& key, int64_t value) {
  return forwarded()->add(key, value);
}

bool ReleasableStore::deleteKey(const std::string& key) { return forwarded()->deleteKey(key); }

bool ReleasableStore::check(const std::vector<std::string>& keys) {
  return forwarded()->check(keys);
}

int64_t ReleasableStore::getNumKeys() { return forwarded()->getNumKeys(); }

void ReleasableStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void ReleasableStore::wait(const std::vector<std::string>& keys,
                           const std::chrono::milliseconds& timeout) {
  // Polled rather than forwarded: a wait forwarded would hold the store for its whole length.
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::milliseconds(1);
  while (!forwarded()->check(keys)) {
    if (timeout != kNoTimeout && std::chrono::steady_clock::now() - start >= timeout) {
      throw std::runtime_error("Wait timeout after " + std::to_string(timeout.count()) +
                               " ms for key " + (keys.empty() ? std::string() : keys.front()));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
}

}  // namespace ddp::detail
