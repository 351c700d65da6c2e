/* commands.h - the subcommands of the mlxcel executable, one file each.
 * Each returns the process exit status (0 ok, 1 runtime error, 2 usage). */
#ifndef MX_COMMANDS_H
#define MX_COMMANDS_H

int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);

#endif
