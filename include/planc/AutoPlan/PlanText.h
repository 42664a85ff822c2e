//===- PlanText.h - Edit the settings sections of a .plan source text -----===//
//
// The auto-planner writes its plans as the user's file with the parallel
// section replaced (and the train and cluster settings it searches set), so
// that the result reads like the input and compiles like it. This is a
// token-level scan (comments and strings skipped, brackets counted), not a
// parse: the edited text is parsed by the frontend afterwards, which is what
// checks it.
//===----------------------------------------------------------------------===//
#ifndef PLANC_AUTOPLAN_PLANTEXT_H
#define PLANC_AUTOPLAN_PLANTEXT_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace planc {

/// `key = value` inside a section; offsets into the text. The value ends
/// with its last token (a trailing `;` or comment is not part of it).
struct SettingSpan {
  std::string key;
  size_t keyBegin = 0, valueBegin = 0, valueEnd = 0;
};

/// A top-level `name { ... }` section: [begin, end) covers the name to the
/// closing brace inclusive; bodyBegin is just after `{`.
struct SectionSpan {
  size_t begin = 0, bodyBegin = 0, end = 0;
  std::vector<SettingSpan> settings;
};

/// The first top-level section called `name` (parallel, train, cluster).
std::optional<SectionSpan> findSection(llvm::StringRef text,
                                       llvm::StringRef name);

/// `text` with the section's settings `values` (key, value text) replaced
/// where present and added at the section's start otherwise; the text is
/// returned unchanged when the section does not exist.
std::string
setSettings(llvm::StringRef text, llvm::StringRef section,
            llvm::ArrayRef<std::pair<std::string, std::string>> values);

/// `text` with the section called `name` replaced by `replacement` (the
/// whole `name { ... }`), or, when it has none, with `replacement` inserted
/// before the train section (or appended).
std::string replaceSection(llvm::StringRef text, llvm::StringRef name,
                           llvm::StringRef replacement);

/// `text` (a file of directory `fromDir`) with its relative imports made
/// absolute, so that it can be written elsewhere.
std::string rebaseImports(llvm::StringRef text, llvm::StringRef fromDir);

} // namespace planc

#endif
