# Writes OUT (a C header defining MX_GIT_DESCRIBE) from `git describe` of the
# checkout at SRC, only when the text changes, so that what includes it is
# rebuilt after a commit and not otherwise.  Outside a git checkout (a
# tarball) the commit is "unknown".
execute_process(COMMAND git -C "${SRC}" describe --always --dirty --abbrev=10
                OUTPUT_VARIABLE desc OUTPUT_STRIP_TRAILING_WHITESPACE
                ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR desc STREQUAL "")
  set(desc "unknown")
endif()
set(text "#define MX_GIT_DESCRIBE \"${desc}\"\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
