//===- ScheduleExport.cpp - a simulated timeline as a trace or a picture --===//
//
// The Chrome trace is for looking at a schedule interactively (Perfetto);
// the SVG is the static figure of the GPipe and Megatron papers, for docs
// and reviews.
//
//===----------------------------------------------------------------------===//

#include "planc/Pipeline/Schedule.h"

#include "llvm/Support/Format.h"
#include "llvm/Support/JSON.h"

#include <algorithm>
#include <map>

using namespace llvm;

namespace planc::pipeline {

// Chrome's reserved color names (catapult's palette): blue, green, orange.
static StringRef traceColor(Phase p) {
  switch (p) {
  case Phase::F:
    return "rail_response";
  case Phase::B:
    return "thread_state_running";
  case Phase::W:
    return "thread_state_iowait";
  }
  llvm_unreachable("unknown phase");
}

void writeChromeTrace(const Program &prog, const Timeline &tl, raw_ostream &os,
                      double timeScaleUs) {
  json::OStream j(os, 1);
  auto us = [&](double t) { return t * timeScaleUs; };
  j.object([&] {
    j.attribute("displayTimeUnit", "ms");
    j.attributeArray("traceEvents", [&] {
      j.object([&] {
        j.attribute("name", "process_name");
        j.attribute("ph", "M");
        j.attribute("pid", 0);
        j.attribute("args", json::Object{{"name", "pipeline"}});
      });
      for (size_t r = 0; r < prog.ranks.size(); ++r) {
        j.object([&] {
          j.attribute("name", "thread_name");
          j.attribute("ph", "M");
          j.attribute("pid", 0);
          j.attribute("tid", (int64_t)r);
          j.attribute("args", json::Object{{"name", "pipeline rank " +
                                                        std::to_string(r)}});
        });
        // Keep the rows in rank order whatever their names sort to.
        j.object([&] {
          j.attribute("name", "thread_sort_index");
          j.attribute("ph", "M");
          j.attribute("pid", 0);
          j.attribute("tid", (int64_t)r);
          j.attribute("args", json::Object{{"sort_index", (int64_t)r}});
        });
      }
      for (size_t r = 0; r < prog.ranks.size(); ++r)
        for (size_t i = 0; i < prog.ranks[r].size(); ++i) {
          const Action &a = prog.ranks[r][i].action;
          auto [start, end] = tl.span[r][i];
          j.object([&] {
            j.attribute("name", label(a));
            j.attribute("cat", phaseName(a.phase));
            j.attribute("ph", "X");
            j.attribute("pid", 0);
            j.attribute("tid", (int64_t)r);
            j.attribute("ts", us(start));
            j.attribute("dur", us(end - start));
            j.attribute("cname", traceColor(a.phase));
            j.attribute("args", json::Object{{"stage", a.stage},
                                             {"microbatch", a.mb},
                                             {"phase", phaseName(a.phase)}});
          });
        }
      // Flows: pair the k-th send on a channel with its k-th receive, the
      // same matching simulate() uses.
      std::map<std::pair<int64_t, int64_t>, std::vector<size_t>> recvSteps;
      for (size_t r = 0; r < prog.ranks.size(); ++r)
        for (size_t i = 0; i < prog.ranks[r].size(); ++i)
          for (const Message &m : prog.ranks[r][i].recvs)
            recvSteps[{m.peer, (int64_t)r}].push_back(i);
      std::map<std::pair<int64_t, int64_t>, size_t> sent;
      int64_t id = 0;
      for (size_t r = 0; r < prog.ranks.size(); ++r)
        for (size_t i = 0; i < prog.ranks[r].size(); ++i)
          for (const Message &m : prog.ranks[r][i].sends) {
            auto ch = std::make_pair((int64_t)r, m.peer);
            size_t k = sent[ch]++;
            auto it = recvSteps.find(ch);
            if (it == recvSteps.end() || k >= it->second.size())
              continue; // unmatched; simulate() would have refused it
            size_t to = it->second[k];
            std::string name = "transfer " + std::to_string(m.transfer) +
                               " mb " + std::to_string(m.mb);
            auto [sStart, sEnd] = tl.span[r][i];
            double rStart = tl.span[m.peer][to].first;
            ++id;
            // The flow starts inside the sending slice (at its end) and
            // binds to the enclosing receiving slice ("bp": "e").
            j.object([&] {
              j.attribute("name", name);
              j.attribute("cat", "transfer");
              j.attribute("ph", "s");
              j.attribute("id", id);
              j.attribute("pid", 0);
              j.attribute("tid", (int64_t)r);
              j.attribute("ts", us(std::max(sStart, sEnd - 1e-6)));
            });
            j.object([&] {
              j.attribute("name", name);
              j.attribute("cat", "transfer");
              j.attribute("ph", "f");
              j.attribute("bp", "e");
              j.attribute("id", id);
              j.attribute("pid", 0);
              j.attribute("tid", m.peer);
              j.attribute("ts", us(rStart));
            });
          }
    });
  });
}

static std::string xmlEscape(StringRef s) {
  std::string out;
  for (char c : s) {
    switch (c) {
    case '<':
      out += "&lt;";
      break;
    case '>':
      out += "&gt;";
      break;
    case '&':
      out += "&amp;";
      break;
    case '"':
      out += "&quot;";
      break;
    default:
      out += c;
    }
  }
  return out;
}

static StringRef svgColor(Phase p) {
  switch (p) {
  case Phase::F:
    return "#4e79a7";
  case Phase::B:
    return "#59a14f";
  case Phase::W:
    return "#f28e2b";
  }
  llvm_unreachable("unknown phase");
}

void writeSvg(const Program &prog, const Timeline &tl, raw_ostream &os,
              StringRef title) {
  // raw_ostream prints doubles in %e; SVG readers accept it, people less so.
  auto n = [](double x) { return formatv("{0:F2}", x).str(); };
  const double left = 110, top = 44, rowH = 30, width = 1000;
  int64_t nRanks = prog.ranks.size();
  double scale = tl.makespan > 0 ? width / tl.makespan : 1;
  double height = top + nRanks * rowH + 48;
  int64_t v = std::max<int64_t>(1, prog.shape.virtualStages);
  std::string heading = title.str();
  if (!heading.empty())
    heading += ": ";
  heading += "bubble " + formatv("{0:F1}", 100 * tl.bubbleFraction).str() +
             "% (idle time per unit of work, mean over ranks)";

  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\""
     << n(left + width + 20) << "\" height=\"" << n(height)
     << "\" font-family=\"sans-serif\">\n";
  os << "<text x=\"" << n(left) << "\" y=\"22\" font-size=\"15\">"
     << xmlEscape(heading) << "</text>\n";
  for (int64_t r = 0; r < nRanks; ++r) {
    double y = top + r * rowH;
    os << "<text x=\"8\" y=\"" << n(y + rowH * 0.62)
       << "\" font-size=\"12\">rank " << r << "</text>\n";
    for (size_t i = 0; i < prog.ranks[r].size(); ++i) {
      const Action &a = prog.ranks[r][i].action;
      auto [start, end] = tl.span[r][i];
      double x = left + start * scale, w = (end - start) * scale;
      // Later chunks of an interleaved rank are lighter, so chunks stay
      // distinguishable while the phase keeps its hue.
      double opacity =
          1.0 - 0.45 *
                    double(a.stage / std::max<int64_t>(1, prog.shape.ranks)) /
                    std::max<int64_t>(1, v - 1);
      os << "<rect x=\"" << n(x) << "\" y=\"" << n(y + 2) << "\" width=\""
         << n(w) << "\" height=\"" << n(rowH - 4) << "\" fill=\""
         << svgColor(a.phase) << "\" fill-opacity=\"" << format("%.2f", opacity)
         << "\" stroke=\"white\" stroke-width=\"0.5\">"
         << "<title>" << xmlEscape(describe(a))
         << format(" [%.3g, %.3g)", start, end) << "</title></rect>\n";
      if (w >= 10)
        os << "<text x=\"" << n(x + w / 2) << "\" y=\"" << n(y + rowH * 0.62)
           << "\" font-size=\"" << format("%.1f", std::min(11.0, w * 0.6))
           << "\" fill=\"white\" text-anchor=\"middle\">" << a.mb
           << "</text>\n";
    }
  }
  // Legend swatches are circles so that every <rect> is a step.
  double ly = top + nRanks * rowH + 26, lx = left;
  Phase phases[] = {Phase::F, Phase::B, Phase::W};
  for (Phase p : phases) {
    if (p == Phase::W && !prog.splitW)
      continue;
    StringRef text =
        p == Phase::F ? "forward"
        : p == Phase::B
            ? (prog.splitW ? "backward (input gradient)" : "backward")
            : "weight gradient";
    os << "<circle cx=\"" << n(lx + 6) << "\" cy=\"" << n(ly - 4)
       << "\" r=\"6\" fill=\"" << svgColor(p) << "\"/>\n";
    os << "<text x=\"" << n(lx + 16) << "\" y=\"" << n(ly)
       << "\" font-size=\"12\">" << text << "</text>\n";
    lx += 40 + 7.0 * text.size();
  }
  os << "</svg>\n";
}

} // namespace planc::pipeline
