//===- PlanText.cpp - Edit the settings sections of a .plan source text ---===//
#include "planc/AutoPlan/PlanText.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

using namespace planc;
using llvm::StringRef;

namespace {
struct Token {
  enum Kind { Ident, Punct, Other } kind;
  size_t begin, end;
};

/// The tokens of `text` that matter here: identifiers, single punctuation
/// characters, and everything else as Other (numbers, strings); comments
/// and whitespace are dropped.
std::vector<Token> tokenize(StringRef text) {
  std::vector<Token> out;
  size_t i = 0, n = text.size();
  while (i < n) {
    char c = text[i];
    if (llvm::isSpace(c)) {
      ++i;
    } else if (text.substr(i).starts_with("//")) {
      size_t e = text.find('\n', i);
      i = e == StringRef::npos ? n : e;
    } else if (text.substr(i).starts_with("/*")) {
      size_t e = text.find("*/", i + 2);
      i = e == StringRef::npos ? n : e + 2;
    } else if (c == '"') {
      size_t j = i + 1;
      while (j < n && text[j] != '"' && text[j] != '\n')
        j += text[j] == '\\' ? 2 : 1;
      j = std::min(n, j + 1);
      out.push_back({Token::Other, i, j});
      i = j;
    } else if (llvm::isAlpha(c) || c == '_') {
      size_t j = i;
      while (j < n && (llvm::isAlnum(text[j]) || text[j] == '_'))
        ++j;
      out.push_back({Token::Ident, i, j});
      i = j;
    } else if (llvm::isDigit(c) || c == '.') {
      size_t j = i;
      while (j < n && (llvm::isAlnum(text[j]) || text[j] == '.' ||
                       ((text[j] == '+' || text[j] == '-') &&
                        (text[j - 1] == 'e' || text[j - 1] == 'E'))))
        ++j;
      out.push_back({Token::Other, i, j});
      i = j;
    } else {
      out.push_back({Token::Punct, i, i + 1});
      ++i;
    }
  }
  return out;
}

bool is(StringRef text, const Token &t, StringRef s) {
  return text.slice(t.begin, t.end) == s;
}
} // namespace

std::optional<SectionSpan> planc::findSection(StringRef text, StringRef name) {
  std::vector<Token> toks = tokenize(text);
  int depth = 0;
  for (size_t i = 0; i < toks.size(); ++i) {
    const Token &t = toks[i];
    if (t.kind == Token::Punct &&
        (is(text, t, "{") || is(text, t, "(") || is(text, t, "[")))
      ++depth;
    else if (t.kind == Token::Punct &&
             (is(text, t, "}") || is(text, t, ")") || is(text, t, "]")))
      --depth;
    if (depth != 0 || t.kind != Token::Ident || !is(text, t, name) ||
        i + 1 >= toks.size() || !is(text, toks[i + 1], "{"))
      continue;
    SectionSpan s;
    s.begin = t.begin;
    s.bodyBegin = toks[i + 1].end;
    // Inside: a setting starts at `IDENT =` (not `==`) outside brackets; its
    // value runs to the last token before the next setting or the `}`.
    int inner = 0;
    SettingSpan *open = nullptr;
    size_t lastEnd = s.bodyBegin;
    for (size_t j = i + 2; j < toks.size(); ++j) {
      const Token &u = toks[j];
      bool opens = u.kind == Token::Punct &&
                   (is(text, u, "{") || is(text, u, "(") || is(text, u, "["));
      bool closes = u.kind == Token::Punct &&
                    (is(text, u, "}") || is(text, u, ")") || is(text, u, "]"));
      if (closes && inner == 0) { // the section's `}`
        if (open)
          open->valueEnd = lastEnd;
        s.end = u.end;
        return s;
      }
      bool starts = inner == 0 && u.kind == Token::Ident &&
                    j + 1 < toks.size() && is(text, toks[j + 1], "=") &&
                    !(j + 2 < toks.size() && is(text, toks[j + 2], "=") &&
                      toks[j + 2].begin == toks[j + 1].end);
      if (starts) {
        if (open)
          open->valueEnd = lastEnd;
        s.settings.push_back(
            {text.slice(u.begin, u.end).str(), u.begin,
             j + 2 < toks.size() ? toks[j + 2].begin : toks[j + 1].end, 0});
        open = &s.settings.back();
        ++j; // the `=`
        lastEnd = toks[j].end;
        continue;
      }
      if (opens)
        ++inner;
      if (closes)
        --inner;
      if (!(inner == 0 && is(text, u, ";")))
        lastEnd = u.end;
    }
    return std::nullopt; // unclosed: the frontend reports it
  }
  return std::nullopt;
}

std::string
planc::setSettings(StringRef text, StringRef section,
                   llvm::ArrayRef<std::pair<std::string, std::string>> values) {
  std::optional<SectionSpan> s = findSection(text, section);
  if (!s)
    return text.str();
  // Edits from the end so that earlier offsets stay valid.
  std::vector<std::pair<std::pair<size_t, size_t>, std::string>> edits;
  std::string added;
  for (auto &[key, value] : values) {
    auto it = llvm::find_if(s->settings,
                            [&](const SettingSpan &x) { return x.key == key; });
    if (it != s->settings.end())
      edits.push_back({{it->valueBegin, it->valueEnd}, value});
    else
      added += "\n  " + key + " = " + value;
  }
  if (!added.empty())
    edits.push_back({{s->bodyBegin, s->bodyBegin}, added});
  llvm::sort(edits, [](auto &a, auto &b) { return a.first > b.first; });
  std::string out = text.str();
  for (auto &[range, value] : edits)
    out.replace(range.first, range.second - range.first, value);
  return out;
}

std::string planc::replaceSection(StringRef text, StringRef name,
                                  StringRef replacement) {
  if (std::optional<SectionSpan> s = findSection(text, name))
    return (text.take_front(s->begin) + replacement + text.drop_front(s->end))
        .str();
  if (std::optional<SectionSpan> t = findSection(text, "train"))
    return (text.take_front(t->begin) + replacement + "\n\n" +
            text.drop_front(t->begin))
        .str();
  return (text + "\n" + replacement + "\n").str();
}

std::string planc::rebaseImports(StringRef text, StringRef fromDir) {
  std::vector<Token> toks = tokenize(text);
  std::string out = text.str();
  // From the end, so that earlier offsets stay valid.
  for (size_t i = toks.size(); i-- > 1;) {
    const Token &str = toks[i];
    if (str.kind != Token::Other || text[str.begin] != '"' ||
        !is(text, toks[i - 1], "import") || str.end - str.begin < 2)
      continue;
    StringRef rel = text.slice(str.begin + 1, str.end - 1);
    if (llvm::sys::path::is_absolute(rel))
      continue;
    llvm::SmallString<256> abs(fromDir);
    llvm::sys::path::append(abs, rel);
    llvm::sys::fs::make_absolute(abs);
    llvm::sys::path::remove_dots(abs, /*remove_dot_dot=*/true);
    out.replace(str.begin, str.end - str.begin, ("\"" + abs + "\"").str());
  }
  return out;
}
