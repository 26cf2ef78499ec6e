/// @file
/// file_store: a store in a directory every rank can see (local, or a shared file system).
///
/// Each key is a file; `set` writes a temporary file and renames it over the key, so readers
/// see the old value or the new one, never half of one. `add` holds an `flock` on a lock file
/// per key (local file systems and NFSv4 honour it). Waits poll with backoff from 1 ms to 20 ms.
/// Give each job its own directory (or its own key prefix). Keys stay until `remove`d; the TCP
/// setup removes the keys each rank wrote (the job's token among them) once the job connected.
///
/// The keys may hold a job's secret, so only this user may read or change them: a directory the
/// store makes is 0700 and key files are 0600; a directory that exists already must belong to
/// this user and be closed to others' writes (else another user could put in keys first, such
/// as a token or an address of their choosing), or the store refuses it, naming it.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include <cohort/core/error.hpp>
#include <cohort/core/options.hpp>
#include <cohort/rendezvous/store.hpp>

namespace cohort {

/// A store in a directory; models `store`. Safe across processes and hosts sharing the directory.
class file_store final : public store {
 public:
  /// Uses `directory`, creating it (mode 0700; its parents as usual) when missing. Throws
  /// `cohort::error`: a system code if it cannot, `std::errc::permission_denied` for a directory
  /// of another user or one that others may write to.
  explicit file_store(std::string directory) : dir_(std::move(directory)) {
    std::error_code ec;
    while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
    const std::filesystem::path parent = std::filesystem::path(dir_).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    if (::mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST)
      ec = std::error_code(errno, std::generic_category());
    struct stat st {};
    if (::stat(dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      throw error(ec ? ec : make_error_code(errc::invalid_argument), "file_store", -1,
                  "file_store: cannot use \"" + dir_ + "\" as a directory" +
                      (ec ? ": " + ec.message() : ""));
    if (st.st_uid != ::geteuid() || (st.st_mode & 022) != 0) {
      char mode[8];
      std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
      throw error(std::make_error_code(std::errc::permission_denied), "file_store", -1,
                  "file_store: refusing the directory " + dir_ + " (uid " +
                      std::to_string(st.st_uid) + ", mode " + mode +
                      "): its keys may hold the job's secret, so it must belong to this user (uid " +
                      std::to_string(::geteuid()) +
                      ") and others must not write to it; use a directory of your own with mode "
                      "0700 (or one that does not exist yet)");
    }
  }

  /// The directory.
  const std::string& directory() const noexcept { return dir_; }

  std::string describe() const override { return "the file store in " + dir_; }

  /// Removes `key` (and its lock file, if `add` made one); absent keys are fine.
  void remove(std::string_view key, std::error_code& ec) {
    ec.clear();
    std::string path;
    if (!path_of(key, path, ec)) return;
    if (::unlink(path.c_str()) != 0 && errno != ENOENT)
      return sys_fail(ec, "cannot remove " + path);
    ::unlink((path + ".lock").c_str());
  }
  void remove(std::string_view key) {
    std::error_code ec;
    remove(key, ec);
    if (ec) throw error(ec, "store.remove", -1, "store.remove: " + last_error());
  }

 protected:
  void do_set(std::string_view key, std::string_view value, std::error_code& ec) override {
    std::string path;
    if (!path_of(key, path, ec)) return;
    write_atomically(path, value, ec);
  }

  std::optional<std::string> do_try_get(std::string_view key, std::error_code& ec) override {
    std::string path;
    if (!path_of(key, path, ec)) return std::nullopt;
    return read_file(path, ec);
  }

  std::int64_t do_add(std::string_view key, std::int64_t n, std::error_code& ec) override {
    std::string path;
    if (!path_of(key, path, ec)) return 0;
    const int lock = ::open((path + ".lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    if (lock < 0) return sys_fail(ec, "add: cannot open the lock file of " + path), 0;
    const auto until = deadline_after(std::chrono::seconds(30));
    while (::flock(lock, LOCK_EX | LOCK_NB) != 0) {
      if (clock::now() >= until) {
        ::close(lock);
        fail(ec, errc::timed_out, "add: could not lock " + path + " within 30 s");
        return 0;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::int64_t value = 0;
    auto old = read_file(path, ec);
    if (!ec && old && !old->empty()) {
      auto [end, e] = std::from_chars(old->data(), old->data() + old->size(), value);
      if (e != std::errc{} || end != old->data() + old->size())
        fail(ec, errc::invalid_argument,
             "add: the value at \"" + std::string(key) + "\" is not an integer");
    }
    std::int64_t sum = 0;
    if (!ec && __builtin_add_overflow(value, n, &sum))
      fail(ec, errc::invalid_argument,
           "add: " + std::to_string(value) + " + " + std::to_string(n) + " at \"" +
               std::string(key) + "\" overflows a 64-bit integer; the value is unchanged");
    if (!ec) {
      value = sum;
      write_atomically(path, std::to_string(value), ec);
    }
    ::flock(lock, LOCK_UN);
    ::close(lock);
    return value;
  }

  std::vector<std::string> do_wait(std::span<const std::string> keys, deadline until,
                                   std::error_code& ec) override {
    std::vector<std::string> missing, paths;
    for (const auto& k : keys) {
      std::string p;
      if (!path_of(k, p, ec)) return {keys.begin(), keys.end()};
      paths.push_back(std::move(p));
    }
    std::vector<std::size_t> left(keys.size());
    for (std::size_t i = 0; i < left.size(); ++i) left[i] = i;
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
      std::erase_if(left, [&](std::size_t i) { return ::access(paths[i].c_str(), F_OK) == 0; });
      if (left.empty()) return {};
      if (clock::now() >= until) break;
      std::this_thread::sleep_for(std::min<clock::duration>(pause, until - clock::now()));
      pause = std::min(pause * 2, std::chrono::milliseconds(20));
    }
    for (std::size_t i : left) missing.push_back(keys[i]);
    fail(ec, errc::timed_out,
         "timed out waiting for " + std::to_string(missing.size()) + " of " +
             std::to_string(keys.size()) + " keys in " + dir_);
    return missing;
  }

 private:
  // Keys become file names: [A-Za-z0-9_-] and inner dots kept, everything else %XX.
  bool path_of(std::string_view key, std::string& path, std::error_code& ec) {
    std::string name;
    for (std::size_t i = 0; i < key.size(); ++i) {
      const unsigned char c = static_cast<unsigned char>(key[i]);
      const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                         (c >= '0' && c <= '9') || c == '_' || c == '-' || (c == '.' && i > 0);
      if (plain) {
        name += static_cast<char>(c);
      } else {
        name += '%';
        name += "0123456789ABCDEF"[c >> 4];
        name += "0123456789ABCDEF"[c & 15];
      }
    }
    if (name.empty() || name.size() > 200) {
      fail(ec, errc::invalid_argument,
           "a file_store key must be 1 to 200 characters once encoded for a file name");
      return false;
    }
    path = dir_ + "/" + name;
    return true;
  }

  void sys_fail(std::error_code& ec, const std::string& what) {
    const int e = errno;
    fail(ec, std::error_code(e, std::generic_category()),
         what + ": " + std::generic_category().message(e));
  }

  void write_atomically(const std::string& path, std::string_view value, std::error_code& ec) {
    static std::atomic<unsigned> counter{0};
    const std::string tmp = dir_ + "/.tmp." + std::to_string(::getpid()) + "." +
                            std::to_string(counter++) + "." +
                            std::to_string(clock::now().time_since_epoch().count());
    const int fd = ::open(tmp.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
    if (fd < 0) return sys_fail(ec, "cannot create " + tmp);
    std::size_t done = 0;
    while (done < value.size()) {
      const ssize_t n = ::write(fd, value.data() + done, value.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        sys_fail(ec, "cannot write " + tmp);
        ::close(fd);
        ::unlink(tmp.c_str());
        return;
      }
      done += static_cast<std::size_t>(n);
    }
    ::close(fd);
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      sys_fail(ec, "cannot rename " + tmp + " to " + path);
      ::unlink(tmp.c_str());
    }
  }

  std::optional<std::string> read_file(const std::string& path, std::error_code& ec) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno != ENOENT) sys_fail(ec, "cannot open " + path);
      return std::nullopt;
    }
    std::string out;
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        sys_fail(ec, "cannot read " + path);
        ::close(fd);
        return std::nullopt;
      }
      if (n == 0) break;
      out.append(buf, static_cast<std::size_t>(n));
    }
    ::close(fd);
    return out;
  }

  std::string dir_;
};

}  // namespace cohort
