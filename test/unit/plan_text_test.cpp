// Unit tests of the auto-planner's editing of plan texts: sections and
// their settings found past comments, strings and brackets; values replaced,
// added, and sections replaced or inserted; relative imports made absolute.
#include "planc/AutoPlan/PlanText.h"

#include <gtest/gtest.h>

using namespace planc;

namespace {

const char *kPlan = R"(// parallel { dp = 9 } in a comment is not the section
import "models/gpt.plan"
name = "train {"
parallel {
  dp = 4   // four ranks
  order = [pp, dp, tp]; tp = 2
  /* pp = 8 */ bucket_mb = 1 + (2 * 3)
}

train {
  batch = 8
  micro_batch = 2
  optimizer = adamw(lr = 2e-3, betas = [0.9, 0.95], eps = 1e-8)
  x = a == b
}
)";

std::string value(llvm::StringRef text, const SectionSpan &s,
                  llvm::StringRef key) {
  for (const SettingSpan &x : s.settings)
    if (x.key == key)
      return text.slice(x.valueBegin, x.valueEnd).str();
  return "<missing>";
}

TEST(PlanText, FindsSectionsAndSettingsPastCommentsAndStrings) {
  auto p = findSection(kPlan, "parallel");
  ASSERT_TRUE(p);
  EXPECT_TRUE(llvm::StringRef(kPlan).substr(p->begin).starts_with(
      "parallel {\n  dp = 4"));
  ASSERT_EQ(p->settings.size(), 4u);
  EXPECT_EQ(value(kPlan, *p, "dp"), "4");               // comment dropped
  EXPECT_EQ(value(kPlan, *p, "order"), "[pp, dp, tp]"); // `;` dropped
  EXPECT_EQ(value(kPlan, *p, "tp"), "2");
  EXPECT_EQ(value(kPlan, *p, "bucket_mb"), "1 + (2 * 3)");
  EXPECT_EQ(kPlan[p->end - 1], '}');

  auto t = findSection(kPlan, "train");
  ASSERT_TRUE(t);
  // Named arguments inside parentheses are not settings; `==` is no `=`.
  EXPECT_EQ(value(kPlan, *t, "optimizer"),
            "adamw(lr = 2e-3, betas = [0.9, 0.95], eps = 1e-8)");
  EXPECT_EQ(value(kPlan, *t, "x"), "a == b");
  EXPECT_EQ(t->settings.size(), 4u);
  EXPECT_FALSE(findSection(kPlan, "cluster"));
}

TEST(PlanText, SetsSettingsInPlaceOrAddsThem) {
  std::string out =
      setSettings(kPlan, "train", {{"micro_batch", "4"}, {"seed", "7"}});
  auto t = findSection(out, "train");
  ASSERT_TRUE(t);
  EXPECT_EQ(value(out, *t, "micro_batch"), "4");
  EXPECT_EQ(value(out, *t, "seed"), "7");
  EXPECT_EQ(value(out, *t, "batch"), "8"); // `micro_batch` is not `batch`
  // Nothing else moved: the parallel section reads as before.
  EXPECT_EQ(value(out, *findSection(out, "parallel"), "bucket_mb"),
            "1 + (2 * 3)");
  // A missing section leaves the text as it was.
  EXPECT_EQ(setSettings(kPlan, "cluster", {{"nodes", "2"}}), kPlan);
}

TEST(PlanText, ReplacesOrInsertsASection) {
  std::string out =
      replaceSection(kPlan, "parallel", "parallel {\n  pp = 2\n}");
  auto p = findSection(out, "parallel");
  ASSERT_TRUE(p);
  ASSERT_EQ(p->settings.size(), 1u);
  EXPECT_EQ(value(out, *p, "pp"), "2");
  EXPECT_NE(out.find("// parallel { dp = 9 }"), std::string::npos);

  // Without one: inserted before the train section.
  std::string none = "model m { }\ntrain {\n  batch = 8\n}\n";
  out = replaceSection(none, "parallel", "parallel {\n  dp = 2\n}");
  EXPECT_LT(out.find("parallel {"), out.find("train {"));
  EXPECT_EQ(value(out, *findSection(out, "parallel"), "dp"), "2");
}

TEST(PlanText, MakesRelativeImportsAbsolute) {
  std::string out = rebaseImports(kPlan, "/plans/x");
  EXPECT_NE(out.find("import \"/plans/x/models/gpt.plan\""), std::string::npos);
  // A string that is not an import stays.
  EXPECT_NE(out.find("name = \"train {\""), std::string::npos);
  EXPECT_EQ(rebaseImports("import \"/abs/a.plan\"", "/plans"),
            "import \"/abs/a.plan\"");
}

} // namespace
