//===- options.h - The generated program's command line ---------*- C++ -*-===//
//
// planrt::run parses its options with CLI11 (the runtime is compiled with
// exceptions). Each option is declared once, with its value name,
// description, default and what it accepts; --help is printed from these
// declarations. The helpers below declare the runtime's kinds of option
// with the runtime's own error messages (tests and docs/runtime.md pin
// some), thrown as UsageError from the option's callback while it is parsed,
// so that the first problem on the command line is the one reported.
//
// Private to the runtime's C++ sources: keep CLI11 out of the .cu files.
//===----------------------------------------------------------------------===//
#ifndef PLANRT_LIB_OPTIONS_H
#define PLANRT_LIB_OPTIONS_H

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <string>

namespace planrt {
namespace internal {

/// A usage error (exit code 2) in the runtime's words.
struct UsageError : CLI::ParseError {
  explicit UsageError(const std::string &message)
      : CLI::ParseError("UsageError", message,
                        CLI::ExitCodes::ValidationError) {}
};

/// An option with one value, `--name V` or `--name=V` (a separate value is
/// taken whatever it looks like: `--prompt --x` prompts with "--x").
/// `store` reads it each time the option is given, in command-line order,
/// and returns "" or the error message.
CLI::Option *
add_value_option(CLI::App &app, const std::string &name,
                 const std::string &value_name, const std::string &description,
                 std::function<std::string(const std::string &)> store);
/// An option whose value may be left out: `--name`, `--name V`, `--name=V`;
/// a following argument that looks like an option is not its value. `store`
/// gets nullptr without a value.
CLI::Option *add_optional_value_option(
    CLI::App &app, const std::string &name, const std::string &value_name,
    const std::string &description,
    std::function<std::string(const std::string *)> store);
/// A decimal integer in [min, max] ("1e3" is not one).
CLI::Option *add_int_option(CLI::App &app, const std::string &name,
                            const std::string &value_name,
                            const std::string &description, int64_t &out,
                            int64_t min, int64_t max = INT64_MAX);
/// A number in [min, max]; `want` describes it in the error message.
CLI::Option *add_number_option(CLI::App &app, const std::string &name,
                               const std::string &value_name,
                               const std::string &description, double &out,
                               double min, double max, const std::string &want);
/// A value that must not be empty: "empty `what` for NAME" otherwise.
CLI::Option *add_path_option(CLI::App &app, const std::string &name,
                             const std::string &value_name,
                             const std::string &description, std::string &out,
                             const std::string &what = "path");
/// A flag (no value); `names` may add a short name: "-h,--help".
CLI::Option *add_flag_option(CLI::App &app, const std::string &names,
                             const std::string &description,
                             std::function<void()> set);

/// The runtime's --help layout: the usage line, the options by group (long
/// name, value name, description wrapped to 80 columns, "(default: X)" from
/// the option's default string) and the app's footer.
std::shared_ptr<CLI::FormatterBase> help_formatter();

enum class ParseResult { Run, Help, Error };
/// Parses argv[1..argc) with `app`: Help when -h or --help comes before any
/// problem; Error with `error` set to the first problem in command-line
/// order (an unknown option, a missing or malformed value).
ParseResult parse_options(CLI::App &app, int argc, char **argv,
                          std::string &error);

/// `value` as a number (strtod: "1e3", "0x10", "inf" and "nan" too); false
/// unless all of it is one.
bool to_number(const std::string &value, double &out);

/// "invalid value 'V' for NAME (want WANT)": the runtime's words for a
/// malformed value.
std::string invalid_value(const std::string &value, const std::string &name,
                          const std::string &want);

} // namespace internal
} // namespace planrt

#endif // PLANRT_LIB_OPTIONS_H
