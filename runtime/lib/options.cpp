//===- options.cpp - The generated program's command line (CLI11) ---------===//
//
// See options.h.
//===----------------------------------------------------------------------===//

#include "options.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <memory>
#include <vector>

namespace planrt {
namespace internal {

namespace {

/// What every option shares: each occurrence is checked and stored as it is
/// parsed (trigger_on_parse), in command-line order, so the first problem is
/// the one reported and a later value replaces an earlier one.
CLI::Option *finish(CLI::Option *opt) {
  return opt->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->trigger_on_parse();
}

/// The option's long name as written ("--steps"), for messages.
std::string long_name(const CLI::Option *opt) {
  return "--" + opt->get_lnames().front();
}

/// `text` word-wrapped to `width` columns, its lines indented to column
/// `indent` but the first (the caller put it there); '\n' in `text` starts a
/// new line.
std::string wrap(const std::string &text, size_t indent, size_t width = 80) {
  std::string out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = std::min(text.find('\n', pos), text.size());
    size_t column = indent;
    bool line_empty = true;
    for (size_t i = pos; i < end;) {
      size_t j = std::min(text.find(' ', i), end);
      std::string word = text.substr(i, j - i);
      i = j + 1;
      if (word.empty())
        continue;
      if (!line_empty && column + 1 + word.size() > width) {
        out += "\n" + std::string(indent, ' ');
        column = indent;
        line_empty = true;
      }
      if (!line_empty) {
        out += ' ';
        ++column;
      }
      out += word;
      column += word.size();
      line_empty = false;
    }
    out += '\n';
    pos = end + 1;
    if (pos < text.size())
      out += std::string(indent, ' ');
  }
  return out;
}

class HelpFormatter : public CLI::FormatterBase {
public:
  std::string make_help(const CLI::App *app, std::string name,
                        CLI::AppFormatMode) const override {
    std::string out = "usage: " + name + " [OPTIONS]\n";
    for (const std::string &group : app->get_groups()) {
      out += "\n" + group + ":\n";
      for (const CLI::Option *opt : app->get_options(
               [&](const CLI::Option *o) { return o->get_group() == group; }))
        out += option_lines(opt);
    }
    if (!app->get_footer().empty())
      out += "\n" + wrap(app->get_footer(), 0);
    return out;
  }

private:
  static constexpr size_t kColumn = 24; // where descriptions start

  /// "  --name VALUE    description (default: X)", wrapped. The lines start
  /// with two spaces and the long name: test/docs/check_options.py reads
  /// them.
  static std::string option_lines(const CLI::Option *opt) {
    std::string head = "  " + long_name(opt);
    for (const std::string &s : opt->get_snames())
      head += ", -" + s;
    if (opt->get_items_expected_max() > 0) {
      bool optional = opt->get_items_expected_min() == 0;
      head += optional ? " [" + opt->get_type_name() + "]"
                       : " " + opt->get_type_name();
    }
    std::string text = opt->get_description();
    if (opt->get_items_expected_min() > 0 && !opt->get_default_str().empty())
      text += " (default: " + opt->get_default_str() + ")";
    if (head.size() + 2 > kColumn)
      head += "\n" + std::string(kColumn, ' ');
    else
      head += std::string(kColumn - head.size(), ' ');
    return head + wrap(text, kColumn);
  }
};

/// The argument list for CLI11, last argument first. CLI11 reads an empty
/// attached value (`--save=`) as no value and takes the next argument
/// instead; the runtime reads the value "" ("empty path for --save"), so
/// `--name=` of an option with a value is passed on as `--name ""`. The
/// value of an option is passed on untouched (`--prompt --save=`).
std::vector<std::string> cli_args(const CLI::App &app, int argc, char **argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    size_t eq = arg.find('=');
    const CLI::Option *opt = arg.size() > 2 && arg.rfind("--", 0) == 0
                                 ? app.get_option_no_throw(arg.substr(0, eq))
                                 : nullptr;
    if (opt && opt->get_items_expected_max() > 0 && eq + 1 == arg.size()) {
      args.push_back(arg.substr(0, eq));
      args.push_back("");
      continue;
    }
    args.push_back(arg);
    if (opt && opt->get_items_expected_min() > 0 && eq == std::string::npos &&
        i + 1 < argc)
      args.push_back(argv[++i]);
  }
  std::reverse(args.begin(), args.end());
  return args;
}

} // namespace

bool to_number(const std::string &value, double &out) {
  char *end = nullptr;
  errno = 0;
  out = std::strtod(value.c_str(), &end);
  return !value.empty() && !*end && !errno;
}

std::string invalid_value(const std::string &value, const std::string &name,
                          const std::string &want) {
  return "invalid value '" + value + "' for " + name + " (want " + want + ")";
}

CLI::Option *
add_value_option(CLI::App &app, const std::string &name,
                 const std::string &value_name, const std::string &description,
                 std::function<std::string(const std::string &)> store) {
  CLI::callback_t callback = [store](const CLI::results_t &values) {
    for (const std::string &v : values) {
      std::string error = store(v);
      if (!error.empty())
        throw UsageError(error);
    }
    return true;
  };
  CLI::Option *opt = app.add_option(name, callback, description);
  opt->type_name(value_name)->expected(1);
  return finish(opt);
}

CLI::Option *add_optional_value_option(
    CLI::App &app, const std::string &name, const std::string &value_name,
    const std::string &description,
    std::function<std::string(const std::string *)> store) {
  // Given without a value, CLI11 passes the option's default string: a
  // marker no argument can be (argv strings hold no NUL).
  static const std::string kNoValue(1, '\0');
  CLI::callback_t callback = [store](const CLI::results_t &values) {
    for (const std::string &v : values) {
      std::string error = store(v == kNoValue ? nullptr : &v);
      if (!error.empty())
        throw UsageError(error);
    }
    return true;
  };
  CLI::Option *opt = app.add_option(name, callback, description);
  opt->type_name(value_name)->expected(0, 1)->default_str(kNoValue);
  return finish(opt);
}

CLI::Option *add_int_option(CLI::App &app, const std::string &name,
                            const std::string &value_name,
                            const std::string &description, int64_t &out,
                            int64_t min, int64_t max) {
  return add_value_option(
      app, name, value_name, description, [&out, name, min, max](auto &v) {
        // strtoll, base 10: CLI11's own conversion also takes 0x10 and 010.
        char *end = nullptr;
        errno = 0;
        long long n = std::strtoll(v.c_str(), &end, 10);
        if (v.empty() || *end || errno || n < min || n > max)
          return invalid_value(v, name, "an integer >= " + std::to_string(min));
        out = n;
        return std::string();
      });
}

CLI::Option *add_number_option(CLI::App &app, const std::string &name,
                               const std::string &value_name,
                               const std::string &description, double &out,
                               double min, double max,
                               const std::string &want) {
  return add_value_option(app, name, value_name, description,
                          [&out, name, min, max, want](auto &v) {
                            double x = 0;
                            if (!to_number(v, x) || !(x >= min && x <= max))
                              return invalid_value(v, name, want);
                            out = x;
                            return std::string();
                          });
}

CLI::Option *add_path_option(CLI::App &app, const std::string &name,
                             const std::string &value_name,
                             const std::string &description, std::string &out,
                             const std::string &what) {
  return add_value_option(
      app, name, value_name, description, [&out, name, what](auto &v) {
        out = v;
        return v.empty() ? "empty " + what + " for " + name : std::string();
      });
}

CLI::Option *add_flag_option(CLI::App &app, const std::string &names,
                             const std::string &description,
                             std::function<void()> set) {
  std::string name = names.substr(names.find("--"));
  // A flag's result is "true", or the value of `--flag=V`, which the runtime
  // refuses.
  CLI::callback_t callback = [name, set](const CLI::results_t &values) {
    for (const std::string &v : values)
      if (v != "true")
        throw UsageError("option '" + name + "' takes no value (got '" + v +
                         "')");
    set();
    return true;
  };
  CLI::Option *opt = app.add_option(names, callback, description);
  opt->expected(0);
  return finish(opt);
}

std::shared_ptr<CLI::FormatterBase> help_formatter() {
  return std::make_shared<HelpFormatter>();
}

ParseResult parse_options(CLI::App &app, int argc, char **argv,
                          std::string &error) {
  // Unknown arguments are kept (CLI11 would report them only at the end) and
  // reported here when they come before the problem CLI11 stopped at.
  app.allow_extras();
  auto first_unknown = [&app]() -> std::string {
    std::vector<std::string> rest = app.remaining();
    return rest.empty() ? "" : "unknown option '" + rest.front() + "'";
  };
  std::vector<std::string> args = cli_args(app, argc, argv);
  bool help = false;
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp &) {
    help = true;
  } catch (const UsageError &e) {
    error = e.what();
  } catch (const CLI::ArgumentMismatch &e) {
    // The last argument is an option whose value is missing (cli_args
    // passes every other value on).
    const CLI::Option *opt =
        argc > 1 ? app.get_option_no_throw(argv[argc - 1]) : nullptr;
    error = opt ? "option '" + long_name(opt) + "' needs a value" : e.what();
  } catch (const CLI::ParseError &e) {
    error = e.what();
  }
  std::string unknown = first_unknown();
  if (!unknown.empty())
    error = unknown;
  if (!error.empty())
    return ParseResult::Error;
  return help ? ParseResult::Help : ParseResult::Run;
}

} // namespace internal
} // namespace planrt
