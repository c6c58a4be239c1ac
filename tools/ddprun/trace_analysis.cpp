#include "trace_analysis.h"

#include <dirent.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "common/atomic_file.h"
#include "json_value.h"

namespace ddprun {
namespace {

struct RankFile {
  int rank = -1;
  std::string reason;
  std::map<std::string, std::vector<int>> group_ranks;
  std::map<std::string, std::vector<TraceCall>> entries;  // by group, in sequence order
};

std::string join(const std::vector<int>& values) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + std::to_string(values[i]);
  return out;
}

std::string ranks_phrase(const std::vector<int>& ranks) {
  return std::string(ranks.size() == 1 ? "rank " : "ranks ") + join(ranks);
}

std::string json_ints(const std::vector<int>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) out += (i ? "," : "") + std::to_string(values[i]);
  return out + "]";
}

std::string json_call(const TraceCall& call) {
  return "{\"seq\":" + std::to_string(call.seq) + ",\"op\":" + JsonQuote(call.op) +
         ",\"call\":" + JsonQuote(call.call) + ",\"dtype\":" + JsonQuote(call.dtype) +
         ",\"numel\":" + std::to_string(call.numel) + ",\"backend\":" + JsonQuote(call.backend) +
         ",\"state\":" + JsonQuote(call.state) + ",\"error\":" + JsonQuote(call.error) + "}";
}

bool read_file(const std::string& path, std::string* text) {
  std::ifstream in(path);
  if (!in) return false;
  std::stringstream buffer;
  buffer << in.rdbuf();
  *text = buffer.str();
  return true;
}

// rank<R>.json, nothing else (not the temporary files of a dump in progress, not diagnosis.json).
bool is_rank_file(const std::string& name) {
  if (name.size() < 10 || name.compare(0, 4, "rank") != 0) return false;
  if (name.compare(name.size() - 5, 5, ".json") != 0) return false;
  for (size_t i = 4; i + 5 < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
  }
  return true;
}

std::optional<RankFile> load(const std::string& path, std::string* problem) {
  std::string text;
  if (!read_file(path, &text)) {
    *problem = path + ": cannot be read";
    return std::nullopt;
  }
  std::string error;
  auto json = ParseJson(text, &error);
  if (!json || json->kind != JsonValue::Kind::kObject) {
    *problem = path + ": not a flight record (" + (json ? "not an object" : error) + ")";
    return std::nullopt;
  }
  RankFile file;
  file.rank = static_cast<int>((*json)["rank"].as_int(-1));
  file.reason = (*json)["reason"].as_string();
  for (const JsonValue& group : (*json)["groups"].items) {
    const std::string name = group["group"].as_string();
    std::vector<int>& ranks = file.group_ranks[name];
    for (const JsonValue& rank : group["ranks"].items) ranks.push_back(int(rank.as_int()));
    std::vector<TraceCall>& calls = file.entries[name];
    for (const JsonValue& entry : group["entries"].items) {
      TraceCall call;
      call.seq = entry["seq"].as_int();
      call.op = entry["op"].as_string();
      call.call = entry["call"].as_string();
      call.dtype = entry["dtype"].as_string();
      call.numel = entry["numel"].as_int();
      call.state = entry["state"].as_string();
      call.error = entry["error"].as_string();
      call.backend = entry["backend"].as_string();
      calls.push_back(call);
    }
    std::sort(calls.begin(), calls.end(),
              [](const TraceCall& a, const TraceCall& b) { return a.seq < b.seq; });
  }
  return file;
}

const TraceCall* find_seq(const std::vector<TraceCall>& calls, int64_t seq) {
  auto at = std::lower_bound(calls.begin(), calls.end(), seq,
                             [](const TraceCall& call, int64_t s) { return call.seq < s; });
  return at != calls.end() && at->seq == seq ? &*at : nullptr;
}

void find_first_difference(GroupDiagnosis& group,
                           const std::map<int, const std::vector<TraceCall>*>& recorded) {
  // Only the numbers every ring still holds can be compared.
  int64_t low = 1, high = 0;
  for (const auto& [rank, calls] : recorded) {
    if (calls->empty()) continue;
    low = std::max(low, calls->front().seq);
    high = std::max(high, calls->back().seq);
  }
  for (int64_t seq = low; seq <= high; ++seq) {
    std::vector<std::pair<int, const TraceCall*>> present;
    std::vector<int> absent;
    for (const auto& [rank, calls] : recorded) {
      if (const TraceCall* call = find_seq(*calls, seq)) {
        present.emplace_back(rank, call);
      } else {
        absent.push_back(rank);
      }
    }
    bool agree = absent.empty();
    for (const auto& [rank, call] : present)
      agree = agree && call->same_call_as(*present[0].second);
    if (agree) continue;
    // What most ranks entered is taken as the program's intent; a tie goes to the lowest rank.
    size_t best = 0, best_count = 0;
    for (size_t i = 0; i < present.size(); ++i) {
      size_t count = 0;
      for (const auto& other : present) count += other.second->same_call_as(*present[i].second);
      if (count > best_count) best = i, best_count = count;
    }
    group.first_difference = seq;
    group.never_entered = absent;
    if (!present.empty()) {
      group.expected = *present[best].second;
      for (const auto& [rank, call] : present) {
        if (call->same_call_as(group.expected)) {
          group.entered_expected.push_back(rank);
        } else {
          group.entered_other.emplace_back(rank, *call);
        }
      }
    }
    return;
  }
}

}  // namespace

std::string TraceCall::describe() const {
  std::string text = op + " #" + std::to_string(seq);
  std::string details;
  if (!dtype.empty()) details = dtype + ", " + std::to_string(numel) + " elements";
  if (call != op && !call.empty()) details += (details.empty() ? "" : ", ") + ("from " + call);
  return details.empty() ? text : text + " (" + details + ")";
}

bool TraceCall::same_call_as(const TraceCall& other) const {
  return op == other.op && dtype == other.dtype && numel == other.numel;
}

Diagnosis AnalyzeTraceDir(const std::string& dir) {
  Diagnosis diagnosis;
  diagnosis.dir = dir;
  std::map<int, RankFile> files;
  if (DIR* folder = opendir(dir.c_str())) {
    while (dirent* item = readdir(folder)) {
      const std::string name = item->d_name;
      if (!is_rank_file(name)) continue;
      std::string problem;
      if (auto file = load(dir + "/" + name, &problem)) {
        files[file->rank] = std::move(*file);
      } else {
        diagnosis.problems.push_back(problem);
      }
    }
    closedir(folder);
  } else {
    diagnosis.problems.push_back(dir + ": cannot be opened");
  }
  if (files.empty()) diagnosis.problems.push_back("no flight records (rank<R>.json) in " + dir);
  std::map<std::string, std::vector<int>> groups;  // every group some rank recorded
  for (const auto& [rank, file] : files) {
    diagnosis.ranks_read.push_back(rank);
    for (const auto& [name, ranks] : file.group_ranks) groups.emplace(name, ranks);
  }
  for (const auto& [name, ranks] : groups) {
    GroupDiagnosis group;
    group.group = name;
    group.ranks = ranks;
    std::map<int, const std::vector<TraceCall>*> recorded;
    for (int rank : ranks) {
      RankInGroup member;
      member.rank = rank;
      auto file = files.find(rank);
      if (file != files.end() && file->second.entries.count(name)) {
        const auto& calls = file->second.entries.at(name);
        member.has_record = true;
        member.reason = file->second.reason;
        recorded[rank] = &calls;
        for (const TraceCall& call : calls) {
          if (call.state == "completed") member.last_completed = call.seq;
          if (call.state != "completed" && !member.has_current) {
            member.has_current = true;
            member.current = call;
          }
        }
      } else {
        group.without_record.push_back(rank);
      }
      group.members.push_back(member);
    }
    find_first_difference(group, recorded);
    diagnosis.groups.push_back(std::move(group));
  }
  return diagnosis;
}

std::string Diagnosis::Summary() const {
  std::string out = "ddprun: flight records of " +
                    (ranks_read.empty() ? std::string("no rank") : ranks_phrase(ranks_read)) +
                    " in " + dir + "\n";
  for (const std::string& problem : problems) out += "  " + problem + "\n";
  for (const GroupDiagnosis& group : groups) {
    out += "group " + group.group + " (ranks " + join(group.ranks) + "):\n";
    for (const RankInGroup& member : group.members) {
      if (!member.has_record) continue;
      out += "  rank " + std::to_string(member.rank) + ": last completed " +
             (member.last_completed ? "#" + std::to_string(member.last_completed)
                                    : std::string("none")) +
             "; ";
      if (member.has_current) {
        out += "current " + member.current.describe() + ", " + member.current.state +
               (member.current.error.empty() ? "" : " (" + member.current.error + ")") + "\n";
      } else {
        out += "no collective in progress\n";
      }
    }
    if (group.first_difference > 0) {
      const std::string at = "#" + std::to_string(group.first_difference);
      out += "  the ranks first differ at " + at + ":";
      if (!group.never_entered.empty()) {
        out += " " + ranks_phrase(group.never_entered) + " never entered " +
               (group.entered_expected.empty() ? at : group.expected.describe()) + ";";
      }
      for (const auto& [rank, call] : group.entered_other) {
        out += " rank " + std::to_string(rank) + " entered " + call.describe() + " instead;";
      }
      if (!group.entered_expected.empty()) {
        out += " " + ranks_phrase(group.entered_expected) + " entered " +
               group.expected.describe() + ".";
      }
      out += "\n";
    } else if (group.without_record.size() < group.ranks.size()) {
      out += "  the ranks with records agree on every collective they share\n";
    }
    if (!group.without_record.empty()) {
      out += "  " + ranks_phrase(group.without_record) +
             " left no record (killed before writing one, or on another host: each ddprun sees "
             "only its own ranks' files)\n";
    }
  }
  return out;
}

std::string Diagnosis::Json() const {
  std::string out =
      "{\"dir\":" + JsonQuote(dir) + ",\"ranks_read\":" + json_ints(ranks_read) + ",\"problems\":[";
  for (size_t i = 0; i < problems.size(); ++i) out += (i ? "," : "") + JsonQuote(problems[i]);
  out += "],\"groups\":[";
  for (size_t g = 0; g < groups.size(); ++g) {
    const GroupDiagnosis& group = groups[g];
    out += std::string(g ? "," : "") + "\n{\"group\":" + JsonQuote(group.group) +
           ",\"ranks\":" + json_ints(group.ranks) + ",\"members\":[";
    for (size_t i = 0; i < group.members.size(); ++i) {
      const RankInGroup& member = group.members[i];
      out += std::string(i ? "," : "") + "\n {\"rank\":" + std::to_string(member.rank) +
             ",\"has_record\":" + (member.has_record ? "true" : "false") +
             ",\"last_completed\":" + std::to_string(member.last_completed) +
             ",\"current\":" + (member.has_current ? json_call(member.current) : "null") +
             ",\"reason\":" + JsonQuote(member.reason) + "}";
    }
    out += "],\"first_difference\":" +
           (group.first_difference ? std::to_string(group.first_difference) : "null") +
           ",\"expected\":" +
           (group.first_difference && !group.entered_expected.empty() ? json_call(group.expected)
                                                                      : "null") +
           ",\"entered_expected\":" + json_ints(group.entered_expected) +
           ",\"never_entered\":" + json_ints(group.never_entered) + ",\"entered_other\":[";
    for (size_t i = 0; i < group.entered_other.size(); ++i) {
      out += std::string(i ? "," : "") +
             "{\"rank\":" + std::to_string(group.entered_other[i].first) +
             ",\"call\":" + json_call(group.entered_other[i].second) + "}";
    }
    out += "],\"without_record\":" + json_ints(group.without_record) + "}";
  }
  out += "],\n\"summary\":" + JsonQuote(Summary()) + "}\n";
  return out;
}

bool WriteDiagnosis(const std::string& dir, std::string* printed) {
  const Diagnosis diagnosis = AnalyzeTraceDir(dir);
  *printed = diagnosis.Summary();
  if (diagnosis.ranks_read.empty()) return false;
  const std::string path = dir + "/diagnosis.json";
  if (!ddp::detail::write_file_atomically(path, diagnosis.Json()).ok()) {
    *printed += "ddprun: cannot write " + path + "\n";
    return false;
  }
  *printed += "ddprun: diagnosis written to " + path + "\n";
  return true;
}

}  // namespace ddprun
