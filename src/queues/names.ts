/** BullMQ queue of create requests placed on a node; drained under the node's admission. */
export const createQueueName = (nodeId: string) => `rb-create-${nodeId}`;
/** BullMQ queue of operations (exec, destroy) on sandboxes a node already runs. */
export const opsQueueName = (nodeId: string) => `rb-ops-${nodeId}`;
