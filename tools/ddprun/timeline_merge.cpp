#include "timeline_merge.h"

#include <dirent.h>

#include <algorithm>
#include <fstream>
#include <regex>
#include <sstream>

#include "common/atomic_file.h"
#include "json_value.h"

namespace ddprun {
namespace {

struct Event {
  bool metadata = false;
  int64_t pid = 0;
  int64_t tid = 0;
  int64_t ts = 0;
  int64_t dur = 0;
  size_t order = 0;  // in its file: keeps begin before end at equal times
  std::string text;
};

// The ranks with a timeline in `dir`, in order.
std::vector<int> RanksWithTimelines(const std::string& dir, std::vector<std::string>* problems) {
  std::vector<int> ranks;
  DIR* listing = opendir(dir.c_str());
  if (!listing) {
    problems->push_back("cannot read the folder " + dir);
    return ranks;
  }
  static const std::regex kName("timeline_rank([0-9]+)\\.json");
  while (dirent* entry = readdir(listing)) {
    std::cmatch match;
    if (std::regex_match(entry->d_name, match, kName)) ranks.push_back(std::stoi(match[1]));
  }
  closedir(listing);
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

std::string Trimmed(const std::string& line) {
  size_t first = line.find_first_not_of(" \t\r");
  if (first == std::string::npos) return "";
  size_t last = line.find_last_not_of(" \t\r,");
  return last == std::string::npos || last < first ? "" : line.substr(first, last - first + 1);
}

void ReadRank(const std::string& path, int rank, std::vector<Event>* events,
              std::vector<std::string>* problems) {
  std::ifstream file(path);
  if (!file) {
    problems->push_back("cannot read " + path);
    return;
  }
  std::string line;
  size_t number = 0;
  while (std::getline(file, line)) {
    ++number;
    const std::string text = Trimmed(line);
    if (text.empty() || text == "[" || text == "]") continue;
    std::string error;
    auto value = ParseJson(text, &error);
    if (!value || value->kind != JsonValue::Kind::kObject) {
      problems->push_back("rank " + std::to_string(rank) + ": line " + std::to_string(number) +
                          " of " + path + " is not an event (" +
                          (value ? std::string("not an object") : error) +
                          "): the rank stopped while writing it?");
      continue;
    }
    Event event;
    event.metadata = (*value)["ph"].as_string() == "M";
    event.pid = (*value)["pid"].as_int(rank);
    event.tid = (*value)["tid"].as_int();
    event.ts = (*value)["ts"].as_int();
    event.dur = (*value)["dur"].as_int();
    event.order = events->size();
    event.text = text;
    events->push_back(std::move(event));
  }
}

}  // namespace

std::string MergedTimeline::Summary() const {
  std::ostringstream out;
  if (path.empty()) {
    out << "ddprun: no timeline to merge";
  } else {
    out << "ddprun: timeline of " << ranks.size() << " rank" << (ranks.size() == 1 ? "" : "s")
        << " (" << events << " events) merged into " << path
        << ": open it in ui.perfetto.dev or chrome://tracing";
  }
  out << "\n";
  for (const auto& problem : problems) out << "ddprun: timeline: " << problem << "\n";
  return out.str();
}

MergedTimeline MergeTimeline(const std::string& dir) {
  MergedTimeline merged;
  merged.ranks = RanksWithTimelines(dir, &merged.problems);
  if (merged.ranks.empty()) return merged;
  std::vector<Event> events;
  for (int rank : merged.ranks) {
    ReadRank(dir + "/timeline_rank" + std::to_string(rank) + ".json", rank, &events,
             &merged.problems);
  }
  // Per rank and row by time; at equal times the longer (enclosing) event first, then file order.
  std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    if (a.metadata != b.metadata) return a.metadata;
    if (a.pid != b.pid) return a.pid < b.pid;
    if (a.metadata) return a.order < b.order;
    if (a.tid != b.tid) return a.tid < b.tid;
    if (a.ts != b.ts) return a.ts < b.ts;
    if (a.dur != b.dur) return a.dur > b.dur;
    return a.order < b.order;
  });
  std::string text = "{\"traceEvents\":[";
  for (size_t i = 0; i < events.size(); ++i) {
    text += i == 0 ? "\n" : ",\n";
    text += events[i].text;
  }
  text += "\n],\"displayTimeUnit\":\"ms\"}\n";
  const std::string path = dir + "/timeline.json";
  const ddp::detail::AtomicWriteResult written = ddp::detail::write_file_atomically(path, text);
  if (written.failed_step == "rename") {
    merged.problems.push_back("cannot rename " + written.temporary + " to " + path);
    return merged;
  }
  if (!written.ok()) {
    merged.problems.push_back("cannot write " + written.temporary);
    return merged;
  }
  merged.path = path;
  merged.events = events.size();
  return merged;
}

}  // namespace ddprun
