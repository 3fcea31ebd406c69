# Builds the dashboard page that GET /dashboard serves (src/api/dashboard_http.c) from the asset
# files beside this script: index.html with dashboard.css and dashboard.js inlined where it has
# the markers <!-- @dashboard.css --> and <!-- @dashboard.js -->, written as a C array (OUT).
#   cmake -DDIR=src/api/dashboard -DOUT=dashboard_page.c -P embed.cmake
file(READ "${DIR}/index.html" html)
file(READ "${DIR}/dashboard.css" css)
file(READ "${DIR}/dashboard.js" js)
string(REPLACE "<!-- @dashboard.css -->" "<style>\n${css}</style>" html "${html}")
string(REPLACE "<!-- @dashboard.js -->" "<script>\n${js}</script>" html "${html}")
file(WRITE "${OUT}.html" "${html}")
file(READ "${OUT}.html" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR bytes "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "((0x..,){24})" "\\1\n" body "${body}")
file(WRITE "${OUT}" "/* Generated from src/api/dashboard/ by src/api/dashboard/embed.cmake: the dashboard page\n"
  " * (HTML with its CSS and JavaScript inlined). Do not edit. */\n"
  "#include <stddef.h>\n"
  "const unsigned char mts__dashboard_page[] = {\n${body}\n};\n"
  "const size_t mts__dashboard_page_len = ${bytes};\n")
