# The `attn demo` command line (included by tests/CMakeLists.txt).
#
# cli.demo checks, in the order they are printed, values of the d2l chapter's examples that do not depend
# on the random inputs: the row with valid length 1, bmm's 4s, the additive and the dot-product
# outputs [[2, 3, 4, 5]] and [[10, 11, 12, 13]] with their uniform weights, the Nadaraya-Watson
# tables, the table of Nadaraya-Watson beside local linear regression (whose numbers cli.kreg
# compares), the closing line. PASS_REGULAR_EXPRESSION makes CTest ignore the exit code, so
# cli.demo_exit_code checks that separately.
# One regular expression in pieces (string(CONCAT): a list would split them at the brackets).
string(CONCAT attn_demo_expected
  "masked_softmax\\(X, valid_lens\\) +# shape \\(2, 2, 4\\)\ntensor\\(\\[\\[\\[1 +, 0 +, 0 +, 0 +\\]"
  ".*torch.bmm\\(Q, K\\) +# shape \\(2, 3, 6\\)\ntensor\\(\\[\\[\\[4, 4, 4, 4, 4, 4\\]"
  ".*3\\. Additive attention"
  ".*# shape \\(2, 1, 4\\)\ntensor\\(\\[\\[\\[ 2,  3,  4,  5\\]\\],\n\n +\\[\\[10, 11, 12, 13\\]\\]\\]\\)"
  ".*\\[\\[\\[0\\.5 +, 0\\.5 +, 0 +, 0 +, 0 +, 0 +, 0 +, 0 +, 0 +, 0 +\\]\\],\n\n"
  " +\\[\\[0\\.1667, 0\\.1667, 0\\.1667, 0\\.1667, 0\\.1667, 0\\.1667, 0 +, 0 +, 0 +, 0 +\\]\\]\\]\\)"
  ".*4\\. Scaled dot-product attention"
  ".*# shape \\(2, 1, 4\\)\ntensor\\(\\[\\[\\[ 2,  3,  4,  5\\]\\],\n\n +\\[\\[10, 11, 12, 13\\]\\]\\]\\)"
  ".*\\[\\[0\\.1667, 0\\.1667, 0\\.1667, 0\\.1667, 0\\.1667, 0\\.1667, 0 +, 0 +, 0 +, 0 +\\]\\]\\]\\)"
  ".*5\\. Nadaraya-Watson"
  ".*\nkernel +width +MSE +f\\(0\\) +f\\(1\\)[^\n]*\ntruth [^\n]*\ngaussian +1 [^\n]*\nboxcar +1 [^\n]*"
  "\nepanechnikov +1 [^\n]*\nconstant +1 "
  ".*\ngaussian +0\\.1 .*\ngaussian +0\\.2 .*\ngaussian +0\\.5 "
  ".*Local linear regression \\(attn::KernelRegression"
  ".*\nfit +bandwidth +MSE +MSE x<0\\.5 +f\\(0\\) +E f\\(0\\) +bias\\^2 x<0\\.5\ntruth [^\n]*"
  "\nnadaraya-watson +[0-9][^\n]*\nlocal linear +[0-9][^\n]*\nlocal linear, NW width +[0-9]"
  ".*Masks beyond valid_lens")
add_test(NAME cli.demo COMMAND $<TARGET_FILE:attn_cli> demo)
set_tests_properties(cli.demo PROPERTIES LABELS cli
  PASS_REGULAR_EXPRESSION "${attn_demo_expected}"
  FAIL_REGULAR_EXPRESSION "error")
add_test(NAME cli.demo_exit_code COMMAND $<TARGET_FILE:attn_cli> demo)
set_tests_properties(cli.demo_exit_code PROPERTIES LABELS cli)

# A subcommand that does not exist is a usage error: non-zero, and exactly 2 (CLI11 parse errors).
add_test(NAME cli.unknown_subcommand COMMAND $<TARGET_FILE:attn_cli> no-such-subcommand)
set_tests_properties(cli.unknown_subcommand PROPERTIES LABELS cli WILL_FAIL TRUE)
add_test(NAME cli.usage_exit_code
  COMMAND sh -c "\"$1\" no-such-subcommand 2>/dev/null; test $? -eq 2" sh $<TARGET_FILE:attn_cli>)
set_tests_properties(cli.usage_exit_code PROPERTIES LABELS cli)
