# Writes the FileDescriptorSet that protoc produced (IN) as a C array (OUT) for server
# reflection: `cmake -DIN=descriptor_set.pb -DOUT=descriptor_set.c -P embed_descriptor.cmake`.
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR bytes "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "((0x..,){24})" "\\1\n" body "${body}")
file(WRITE "${OUT}" "/* Generated from proto/*.proto by proto/embed_descriptor.cmake: the serialized\n"
  " * FileDescriptorSet served by gRPC server reflection. Do not edit. */\n"
  "#include <stddef.h>\n"
  "const unsigned char mts__grpc_descriptor_set[] = {\n${body}\n};\n"
  "const size_t mts__grpc_descriptor_set_len = ${bytes};\n")
