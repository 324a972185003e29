#include "hub.h"

#include <httplib.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "common.h"
#include "dory/error.h"

namespace dory::cli {

namespace fs = std::filesystem;

namespace {

struct Sibling {
  std::string name;    // path in the repository
  std::string blob;    // the cache's blob name: LFS sha256, else the git blob sha1
  std::string sha256;  // LFS files
  uint64_t size = 0;
};

std::string env(const char* k) {
  const char* v = std::getenv(k);
  return v ? v : "";
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

bool valid_repo(const std::string& r) {
  const size_t slash = r.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == r.size() ||
      r.find('/', slash + 1) != std::string::npos)
    return false;
  for (char c : r)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.' &&
        c != '/')
      return false;
  return r.find("..") == std::string::npos;
}

// A GGUF file's quant tag: the last '-' or '.' separated word before ".gguf", shard suffix
// ("-00001-of-00003") removed: "Dory-4B-Q5_K_M.gguf" -> "Q5_K_M".
std::string quant_tag(std::string n) {
  n = n.substr(n.rfind('/') == std::string::npos ? 0 : n.rfind('/') + 1);
  n = n.substr(0, n.size() - 5);
  const size_t of = n.rfind("-of-");
  if (of != std::string::npos && of >= 6 && n[of - 6] == '-') n = n.substr(0, of - 6);
  const size_t cut = n.find_last_of("-.");
  return upper(cut == std::string::npos ? n : n.substr(cut + 1));
}

// The shard prefix ("...-Q8_0-") of "...-Q8_0-00001-of-00003.gguf", or "" when not sharded.
std::string shard_prefix(const std::string& n) {
  const size_t of = n.rfind("-of-");
  if (of == std::string::npos || of < 6 || n[of - 6] != '-' || !ends_with(n, ".gguf")) return "";
  return n.substr(0, of - 5);
}

bool has_word(const std::string& name, const std::string& tag) {
  const std::string u = upper(name), t = upper(tag);
  for (size_t p = u.find(t); p != std::string::npos; p = u.find(t, p + 1)) {
    const bool left = p == 0 || !std::isalnum(static_cast<unsigned char>(u[p - 1]));
    const size_t e = p + t.size();
    const bool right = e >= u.size() || !std::isalnum(static_cast<unsigned char>(u[e]));
    if (left && right) return true;
  }
  return false;
}

// What to fetch for REPO[:QUANT] from the repository's file list.
std::vector<Sibling> pick(const std::string& repo, const std::string& quant,
                          const std::vector<Sibling>& all) {
  std::vector<const Sibling*> ggufs;
  for (const Sibling& s : all)
    if (ends_with(s.name, ".gguf") && s.name.find("mmproj") == std::string::npos)
      ggufs.push_back(&s);
  auto tags = [&] {
    std::vector<std::string> t;
    for (const Sibling* s : ggufs)
      if (std::find(t.begin(), t.end(), quant_tag(s->name)) == t.end())
        t.push_back(quant_tag(s->name));
    std::string out;
    for (const std::string& x : t) out += (out.empty() ? "" : ", ") + x;
    return out;
  };
  if (!ggufs.empty()) {
    const Sibling* chosen = nullptr;
    const std::string want = quant.empty() ? (ggufs.size() == 1 ? "" : "Q4_K_M") : quant;
    if (want.empty()) chosen = ggufs[0];
    for (const Sibling* s : ggufs)
      if (!chosen && has_word(s->name, want)) chosen = s;
    if (!chosen)
      throw Error(repo + ": no GGUF file for " +
                  (quant.empty() ? "the default Q4_K_M" : "'" + quant + "'") + "; it has " +
                  tags() + " (give " + repo + ":TAG)");
    std::vector<Sibling> out;
    const std::string pre = shard_prefix(chosen->name);
    for (const Sibling* s : ggufs)
      if (s == chosen ||
          (!pre.empty() && s->name.rfind(pre, 0) == 0 && !shard_prefix(s->name).empty()))
        out.push_back(*s);
    std::sort(out.begin(), out.end(),
              [](const Sibling& a, const Sibling& b) { return a.name < b.name; });
    return out;
  }
  if (!quant.empty())
    throw Error(repo + " has no GGUF files ('" + quant + "' selects among GGUF quants); give " +
                repo + " alone for its safetensors");
  std::map<std::string, const Sibling*> by_name;
  for (const Sibling& s : all) by_name[s.name] = &s;
  if (!by_name.count("config.json"))
    throw Error(
        repo +
        " has neither GGUF files nor a config.json with safetensors: not a model dory can run");
  std::vector<Sibling> out;
  for (const char* n : {"config.json", "generation_config.json", "tokenizer.json",
                        "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                        "model.safetensors.index.json", "model.safetensors"})
    if (by_name.count(n)) out.push_back(*by_name[n]);
  bool any = false;
  for (const Sibling& s : all)
    if (ends_with(s.name, ".safetensors") && s.name.find('/') == std::string::npos) {
      any = true;
      if (s.name != "model.safetensors") out.push_back(s);
    }
  if (!any) throw Error(repo + " has a config.json but no .safetensors files");
  return out;
}

std::string hex(const unsigned char* p, unsigned n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (unsigned i = 0; i < n; ++i) s += d[p[i] >> 4], s += d[p[i] & 15];
  return s;
}

// sha256 of the file, or the git blob sha1 ("blob SIZE\0" + content) when git.
std::string file_hash(const std::string& path, bool git, uint64_t size) {
  EVP_MD_CTX* c = EVP_MD_CTX_new();
  EVP_DigestInit_ex(c, git ? EVP_sha1() : EVP_sha256(), nullptr);
  if (git) {
    const std::string h = "blob " + std::to_string(size);
    EVP_DigestUpdate(c, h.data(), h.size() + 1);  // with its NUL
  }
  std::ifstream f(path, std::ios::binary);
  std::vector<char> buf(1 << 20);
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (f.gcount() > 0) EVP_DigestUpdate(c, buf.data(), static_cast<size_t>(f.gcount()));
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  EVP_DigestFinal_ex(c, md, &n);
  EVP_MD_CTX_free(c);
  return hex(md, n);
}

// "\rNAME: 1.2 GiB / 4.5 GiB (26%), 85.3 MiB/s, ETA 40 s", at most every 0.25 s.
class Progress {
 public:
  Progress(std::string name, uint64_t total, uint64_t start, bool quiet)
      : name_(std::move(name)), total_(total), start_(start), quiet_(quiet), t0_(clock::now()) {}
  void update(uint64_t have, bool force = false) {
    if (quiet_) return;
    const double t = std::chrono::duration<double>(clock::now() - t0_).count();
    if (!force && t - last_ < 0.25) return;
    last_ = t;
    const double rate = t > 0 ? static_cast<double>(have - start_) / t : 0;
    char eta[32] = "";
    if (rate > 0 && have < total_)
      std::snprintf(eta, sizeof eta, ", ETA %.0f s", (total_ - have) / rate);
    std::fprintf(stderr, "\r%s: %s / %s (%.0f%%), %s/s%s   ", name_.c_str(),
                 human_bytes(have).c_str(), human_bytes(total_).c_str(),
                 100.0 * have / std::max<uint64_t>(1, total_),
                 human_bytes(static_cast<uint64_t>(rate)).c_str(), eta);
    std::fflush(stderr);
    shown_ = true;
  }
  void end() {
    if (shown_) std::fputc('\n', stderr);
  }

 private:
  using clock = std::chrono::steady_clock;
  std::string name_;
  uint64_t total_, start_;
  bool quiet_, shown_ = false;
  clock::time_point t0_;
  double last_ = -1;
};

class Hub {
 public:
  explicit Hub(const HubOptions& o) : o_(o), cli_(o.endpoint) {
    cli_.set_follow_location(true);
    cli_.set_connection_timeout(15);
    cli_.set_read_timeout(60);
    if (!o.token.empty()) headers_.emplace("Authorization", "Bearer " + o.token);
    if (!cli_.is_valid())
      throw Error("HF_ENDPOINT '" + o.endpoint + "' is not a URL this build can reach");
  }

  // The commit and file list of the repository's main branch.
  std::string list(const std::string& repo, std::vector<Sibling>* out) {
    auto res = cli_.Get("/api/models/" + repo + "/revision/main?blobs=true", headers_);
    if (!res) throw Unreachable(httplib::to_string(res.error()));
    status(repo, res->status, "");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(res->body);
    } catch (const std::exception&) {
      throw Error(o_.endpoint + ": the Hub's answer for " + repo + " is not JSON");
    }
    if (!j.is_object() || !j.contains("sha") || !j["sha"].is_string() || !j.contains("siblings") ||
        !j["siblings"].is_array())
      throw Error(o_.endpoint + ": the Hub's answer for " + repo + " has no commit or file list");
    for (const auto& s : j["siblings"]) {
      if (!s.is_object() || !s.contains("rfilename") || !s["rfilename"].is_string()) continue;
      Sibling x;
      x.name = s["rfilename"];
      if (s.contains("lfs") && s["lfs"].is_object()) {
        x.sha256 = s["lfs"].value("sha256", "");
        x.size = s["lfs"].value("size", uint64_t{0});
        x.blob = x.sha256;
      } else {
        x.blob = s.value("blobId", "");
        x.size = s.value("size", uint64_t{0});
      }
      out->push_back(x);
    }
    const std::string commit = j["sha"];
    if (commit.empty() || commit.find_first_not_of("0123456789abcdef") != std::string::npos)
      throw Error(o_.endpoint + ": the Hub's commit for " + repo + " is not a hash");
    return commit;
  }

  // Fetches FILE at COMMIT into `tmp`, resuming what is there, retrying dropped connections.
  void fetch(const std::string& repo, const std::string& commit, const Sibling& s,
             const std::string& tmp) {
    const std::string path = "/" + repo + "/resolve/" + commit + "/" + s.name;
    std::string last = "no attempt";
    uint64_t have = fs::exists(tmp) ? fs::file_size(tmp) : 0;
    Progress bar(s.name, s.size, have, o_.quiet);
    for (int attempt = 0; attempt < 6; ++attempt) {
      if (s.size && have == s.size) break;
      if (s.size && have > s.size) have = 0, fs::resize_file(tmp, 0);
      httplib::Headers h = headers_;
      if (have > 0) h.emplace("Range", "bytes=" + std::to_string(have) + "-");
      std::FILE* f = std::fopen(tmp.c_str(), have > 0 ? "ab" : "wb");
      if (!f) throw Error("cannot write " + tmp);
      int st = 0;
      bool write_failed = false;
      // Redirects by hand: the Hub sends LFS files to another host (its CDN, presigned URLs),
      // which must not get the token (as huggingface_hub, through requests, drops it).
      std::string base = o_.endpoint, p = path, loc;
      httplib::Result res{nullptr, httplib::Error::Unknown};
      for (int hop = 0; hop < 8; ++hop) {
        httplib::Client c(base);
        c.set_follow_location(false);
        c.set_connection_timeout(15);
        c.set_read_timeout(60);
        httplib::Headers hh = base == o_.endpoint ? h : httplib::Headers{};
        if (base != o_.endpoint && have > 0)
          hh.emplace("Range", "bytes=" + std::to_string(have) + "-");
        loc.clear();
        res = c.Get(
            p, hh,
            [&](const httplib::Response& r) {
              st = r.status;
              if (r.status >= 300 && r.status < 400) {
                loc = r.get_header_value("Location");
                return false;
              }
              if (r.status == 200 && have > 0) {  // the server ignored the range: start over
                std::fclose(f);
                f = std::fopen(tmp.c_str(), "wb");
                have = 0;
              }
              return (r.status == 200 || r.status == 206) && f;
            },
            [&](const char* d, size_t n) {
              if (std::fwrite(d, 1, n, f) != n) return write_failed = true, false;
              have += n;
              bar.update(have);
              return true;
            });
        if (loc.empty()) break;
        if (loc.rfind("http://", 0) == 0 || loc.rfind("https://", 0) == 0) {
          const size_t slash = loc.find('/', loc.find("//") + 2);
          base = slash == std::string::npos ? loc : loc.substr(0, slash);
          p = slash == std::string::npos ? "/" : loc.substr(slash);
        } else if (!loc.empty() && loc[0] == '/') {
          p = loc;
        } else {
          throw Error(repo + "/" + s.name + ": the Hub redirected to '" + loc + "'");
        }
      }
      if (f) std::fclose(f);
      if (write_failed) throw Error("cannot write " + tmp + " (disk full?)");
      if (res && st != 200 && st != 206) status(repo, st, s.name);
      if (res && (!s.size || have == s.size)) break;
      last = res ? "the connection ended early" : httplib::to_string(res.error());
      std::this_thread::sleep_for(std::chrono::milliseconds(200 * (attempt + 1)));
    }
    bar.end();
    if (s.size && have != s.size)
      throw Error(repo + "/" + s.name + ": download stopped at " + human_bytes(have) + " of " +
                  human_bytes(s.size) + " (" + last + "); run the command again to resume");
  }

  struct Unreachable : Error {
    using Error::Error;
  };

 private:
  void status(const std::string& repo, int st, const std::string& file) {
    if (st >= 200 && st < 300) return;
    const std::string what = file.empty() ? repo : repo + "/" + file;
    if (st == 401 || st == 403)
      throw Error(what + ": the Hub answered " + std::to_string(st) + ": " +
                  (o_.token.empty()
                       ? "a gated or private repository; set HF_TOKEN to a token with access"
                       : "HF_TOKEN has no access to it (accept its terms on the Hub?)"));
    if (st == 404) throw Error(what + ": not found on " + o_.endpoint);
    throw Error(what + ": the Hub answered HTTP " + std::to_string(st));
  }

  const HubOptions& o_;
  httplib::Client cli_;
  httplib::Headers headers_;
};

std::vector<Sibling> local_files(const fs::path& snap) {
  std::vector<Sibling> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(snap, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
    if (fs::is_regular_file(it->path(), ec)) {
      Sibling s;
      s.name =
          it->path().lexically_relative(snap).string();  // not relative(): it follows the links
      out.push_back(s);
    }
  return out;
}

std::string read_ref(const fs::path& p) {
  std::ifstream f(p);
  std::string s;
  std::getline(f, s);
  return s;
}

}  // namespace

HubOptions HubOptions::from_env() {
  HubOptions o;
  o.endpoint = env("HF_ENDPOINT").empty() ? "https://huggingface.co" : env("HF_ENDPOINT");
  while (!o.endpoint.empty() && o.endpoint.back() == '/') o.endpoint.pop_back();
  o.token = env("HF_TOKEN");
  const std::string off = upper(env("HF_HUB_OFFLINE"));
  o.offline = off == "1" || off == "TRUE" || off == "YES" || off == "ON";
  if (!env("HF_HUB_CACHE").empty())
    o.cache = env("HF_HUB_CACHE");
  else if (!env("HF_HOME").empty())
    o.cache = env("HF_HOME") + "/hub";
  else if (!env("XDG_CACHE_HOME").empty())
    o.cache = env("XDG_CACHE_HOME") + "/huggingface/hub";
  else
    o.cache = (env("HOME").empty() ? std::string("/tmp") : env("HOME")) + "/.cache/huggingface/hub";
  return o;
}

PullResult hub_pull(const std::string& spec, const HubOptions& o) {
  std::string repo = spec, quant;
  if (const size_t c = spec.find(':'); c != std::string::npos)
    repo = spec.substr(0, c), quant = spec.substr(c + 1);
  if (!valid_repo(repo) || (spec.find(':') != std::string::npos && quant.empty()))
    throw Error(
        "'" + spec +
        "' is not a Hub model name (ORG/NAME, or ORG/NAME:QUANT as in org/model-GGUF:Q4_K_M)");
  std::string dir_name = "models--" + repo;
  dir_name.replace(dir_name.find('/'), 1, "--");
  const fs::path root = fs::path(o.cache) / dir_name;
  const fs::path ref = root / "refs" / "main";

  auto from_cache = [&](const std::string& why) {
    const std::string commit = fs::exists(ref) ? read_ref(ref) : "";
    const fs::path snap = root / "snapshots" / commit;
    if (commit.empty() || !fs::is_directory(snap))
      throw Error(repo + ": " + why + ", and it is not in the cache (" + root.string() + ")");
    const std::vector<Sibling> files = pick(repo, quant, local_files(snap));
    PullResult r;
    for (const Sibling& s : files) {
      if (!fs::exists(snap / s.name))
        throw Error(repo + ": " + why + ", and the cache lacks " + s.name);
      r.files.push_back((snap / s.name).string());
    }
    r.path = ends_with(files[0].name, ".gguf") ? (snap / files[0].name).string() : snap.string();
    return r;
  };
  if (o.offline) return from_cache("HF_HUB_OFFLINE is set");

  Hub hub(o);
  std::vector<Sibling> all;
  std::string commit;
  try {
    commit = hub.list(repo, &all);
  } catch (const Hub::Unreachable& e) {
    PullResult r = from_cache(o.endpoint + " is unreachable (" + std::string(e.what()) + ")");
    std::fprintf(stderr, "%s is unreachable (%s): using the cached snapshot\n", o.endpoint.c_str(),
                 e.what());
    return r;
  }
  const std::vector<Sibling> files = pick(repo, quant, all);
  const fs::path snap = root / "snapshots" / commit;
  fs::create_directories(root / "blobs");
  PullResult r;
  for (const Sibling& s : files) {
    if (s.blob.empty() || s.blob.find_first_not_of("0123456789abcdef") != std::string::npos)
      throw Error(repo + ": the Hub gave no hash for " + s.name);
    const fs::path link = snap / s.name, blob = root / "blobs" / s.blob;
    std::error_code ec;
    const bool have = fs::exists(link, ec) && fs::exists(blob, ec) &&
                      (!s.size || fs::file_size(blob, ec) == s.size);
    if (!have) {
      if (!fs::exists(blob, ec) || (s.size && fs::file_size(blob, ec) != s.size)) {
        const std::string tmp = blob.string() + ".incomplete";
        hub.fetch(repo, commit, s, tmp);
        const bool lfs = !s.sha256.empty();
        const std::string got = file_hash(tmp, !lfs, fs::file_size(tmp));
        if (got != s.blob) {
          fs::remove(tmp, ec);
          throw Error(repo + "/" + s.name + ": " + (lfs ? "SHA-256 " : "git blob SHA-1 ") + got +
                      " is not the Hub's " + s.blob + "; the download was removed");
        }
        fs::rename(tmp, blob);
        ++r.downloaded;
      }
      // snapshots/COMMIT/a/b.gguf -> ../../../blobs/HASH (one more ../ per folder in the name)
      fs::create_directories(link.parent_path());
      std::string rel = "../../blobs/" + s.blob;
      for (char c : s.name)
        if (c == '/') rel = "../" + rel;
      fs::remove(link, ec);
      fs::create_symlink(rel, link);
    }
    r.files.push_back(link.string());
  }
  fs::create_directories(ref.parent_path());
  std::ofstream(ref) << commit;
  r.path = ends_with(files[0].name, ".gguf") ? (snap / files[0].name).string() : snap.string();
  return r;
}

}  // namespace dory::cli
