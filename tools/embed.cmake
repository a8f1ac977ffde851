# embed.cmake — write a file's bytes as a C array (cmake -DIN=file -DOUT=header -DNAME=SYMBOL -P embed.cmake): the
# chat page of `flashlm serve` (tools/serve_page.html) is compiled into the program, nothing is read at run time.
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR len "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" body "${body}")
file(WRITE "${OUT}.tmp" "/* generated from ${IN} by tools/embed.cmake: do not edit */\n"
     "static const unsigned char ${NAME}[] = {\n${body}0x00};\n"
     "static const size_t ${NAME}_LEN = ${len};\n")
file(RENAME "${OUT}.tmp" "${OUT}")
