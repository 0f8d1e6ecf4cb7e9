# dtr_add_test(NAME SOURCES... DEPS targets... LABELS labels...)
# One GoogleTest executable in build/bin, registered with ctest under the given labels
# ("unit" tests run in every build, sanitized builds included; "threads" also run under TSan).
function(dtr_add_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  add_test(NAME ${name} COMMAND ${name} --gtest_brief=1)
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}")
endfunction()
