/* `kvtier ec-consumer` and `kvtier ec-producer` (ec_cmds.c). */
#ifndef KVT_TOOLS_EC_CMDS_H
#define KVT_TOOLS_EC_CMDS_H

/* Each returns a process exit code: 0 when every item arrived (consumer: intact; producer:
 * pushed on every shard), 1 on a failure, 2 on bad options. */
int kvt_cmd_ec_consumer(int argc, char **argv);
int kvt_cmd_ec_producer(int argc, char **argv);

#endif
