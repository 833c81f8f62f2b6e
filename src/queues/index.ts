export { chooseNode, eligibleNodes, idleHeartbeat, loadScore } from './placement.ts';
export type { AssumedLoad, PlacementCandidate, PlacementRequest, PlacementOptions } from './placement.ts';
export { NodeDirectory } from './node-directory.ts';
export { ReplyHub, publishReply } from './replies.ts';
export { InboxConsumer, ackInbox, handOverOps, inboxKey, pendingOps, pushToInbox, takeOutExecOps } from './inbox.ts';
export type { InboxLane, InboxReceipt } from './inbox.ts';
