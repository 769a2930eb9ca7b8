// ScopedEnv (tests/test_util.hpp), on the CPU: the tuned-kernel tests set SA_TUNE_* switches for
// their scope; a suite run with a switch already set must keep it for the tests after them.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "test_util.hpp"

namespace sa_test {
namespace {

constexpr const char* kName = "SA_TEST_SCOPED_ENV_PROBE";

TEST(ScopedEnv, RestoresThePreviousValue) {
  setenv(kName, "outer", 1);
  {
    const ScopedEnv inner(kName, "inner");
    ASSERT_NE(std::getenv(kName), nullptr);
    EXPECT_EQ(std::string(std::getenv(kName)), "inner");
  }
  ASSERT_NE(std::getenv(kName), nullptr);
  EXPECT_EQ(std::string(std::getenv(kName)), "outer");
  unsetenv(kName);
}

TEST(ScopedEnv, UnsetsWhenUnsetBefore) {
  unsetenv(kName);
  {
    const ScopedEnv inner(kName, "inner");
    EXPECT_NE(std::getenv(kName), nullptr);
  }
  EXPECT_EQ(std::getenv(kName), nullptr);
}

}  // namespace
}  // namespace sa_test
