export { ERROR_CODES, RollboxError, httpStatusOf, isErrorCode } from './errors.ts';
export type { ErrorCode } from './errors.ts';
export {
  LayerDigest,
  LayerRef,
  ImageRef,
  ImageSpec,
  baseOf,
  Resources,
  ResourceFields,
  reservationOf,
  SandboxClass,
  SandboxTier,
  NetworkAllowRule,
  NetworkPolicy,
  SANDBOX_GATEWAY,
  SANDBOX_GATEWAY_URL,
  hasNetwork,
  CreateSandboxRequest,
  ExecUser,
  Platform,
  SandboxState,
  FailureReason,
  TERMINAL_STATES,
  STATE_TRANSITIONS,
  isTerminal,
  Sandbox,
  ListSandboxesQuery,
  SandboxList,
  PauseRequest,
  PauseMode,
  TtlRequest,
  PolicyPatch,
  JobActionResult,
  Lineage,
} from './sandbox.ts';
export { ForkRequest, SnapshotForkRequest, ForkChild, ForkResult, MAX_FORK_CHILDREN } from './fork.ts';
export {
  ExecRequest,
  ExecResult,
  CommandState,
  CommandRecord,
  CommandStatus,
  ListCommandsQuery,
  CommandList,
  DEFAULT_EXEC_TIMEOUT_MS,
  DEFAULT_BACKGROUND_TIMEOUT_MS,
  SIGNAL_NUMBERS,
  SignalName,
  CommandSignalRequest,
  CommandStdinRequest,
  CommandInputResult,
  PtySize,
  PtyRequest,
  CommandResizeRequest,
} from './exec.ts';
export { Layer, LayerName, LayerList, UploadLayerQuery, SnapshotRequest, LayerChunkTable, CHUNK_TABLE_FORMAT } from './layer.ts';
export { ImageName, ImportImageQuery, ImageConfig, ImageLayer, Image, ImageState, PullImageRequest, PullProgress, ImagePull, ImageRecord, ImportReport, ImportedImage, ImageList, MAX_STACK_LAYERS, withImageDefaults } from './image.ts';
export { NodeHeartbeat, NodeList } from './node.ts';
export { PoolName, PutPoolRequest, PoolRecord, Pool, PoolList, NodePoolStatus } from './pool.ts';
export {
  FilesReadQuery,
  FilesWriteQuery,
  FilesWriteResult,
  FILES_TAR_TYPE,
  FILES_BYTES_TYPE,
  FileEntry,
  FilesPathQuery,
  FilesListQuery,
  FilesList,
  MakeDirRequest,
  MakeDirResult,
  MoveRequest,
  MoveResult,
  RemoveResult,
  FilesMetaAction,
} from './files.ts';
export {
  E2B_API_KEY_PATTERN,
  E2bNewSandbox,
  E2bTimeoutBody,
  E2bPauseBody,
  E2bListQuery,
  E2bProcessSelector,
  E2bStartRequest,
  E2bConnectRequest,
  E2bListRequest,
  E2bSendSignalRequest,
  E2bSendInputRequest,
  E2bUpdateRequest,
  E2bStreamInputRequest,
  E2bCloseStdinRequest,
  E2bPathRequest,
  E2bListDirRequest,
  E2bMoveRequest,
  E2bWatchDirRequest,
  E2bWatcherRequest,
} from './e2b.ts';
export { ErrorBody, ROLLOUT_KEY_PATTERN, SCOPES, Scope, issuesText } from './common.ts';
export { CreateJob, NodeOp, Reply, RunOnce, RuntimeMetrics } from './internal.ts';
export type { Ran } from './internal.ts';
export { BurstPolicy, UtilizationBasis, TraceEvent, TraceHeader, TRACE_FORMAT, BurstDecisionReason, CloudHostState, BurstCloudHost, BurstStatus } from './burst.ts';
export { newId } from './ids.ts';
export { RunRequest, RunStatus, RunResult } from './run.ts';
export { RunCodeRequest, RunCodeResponse, CommandRunResult, RunCodeLanguage } from './run-code.ts';
export { ImageCheckRequest, ImageCheckState, ImageCheckRun, ImageCheck } from './image-check.ts';
export { BatchStep, BatchGrade, BatchTask, BatchOptions, CreateBatchRequest, CreateRolloutRequest, BatchSubmitQuery, BatchState, TERMINAL_BATCH_STATES, TaskStatus, BatchCounts, Batch, BatchList, StepResult, BatchResultLine, BatchResultsQuery, BatchEventsQuery, FollowedRollout, BatchTaskStatus, Rollout } from './batch.ts';
export { RefusalCounts, SignalFigures, SignalSeries, CapacityQuery, CapacityScenario, CapacityReport, ConsoleQuery, ConsoleSnapshot, RecentCreate, BurstSimulationRequest, BurstSimulation } from './console.ts';
export { MODEL_APIS, ModelApi, ModelHeaders, ModelBaseUrl, ModelUpstream, ModelTokenFields, ModelBinding, ModelHoldState, ModelFigures, ModelBindingView, ModelLimits, ModelUsage, ModelAttempt, ModelTokens, ModelCallRecord, ModelCallList } from './model.ts';
export type { ModelBindingParsed } from './model.ts';
export { TrajectoryEntry, Trajectory, RolloutAgent, RolloutModel, RolloutLimits, RolloutOutcome, RolloutRecord, RolloutTimesMs, ROLLOUT_TIME_PARTS, type RolloutTimePart, RolloutEnd, JobRolloutTimes } from './rollout.ts';
export { E2bSnapshotBody, E2bSnapshotsQuery, E2bSnapshotRecord, E2bForkBody, E2bMetricsQuery, E2bNetworkUpdate, SandboxMetrics } from './e2b-control.ts';
export { BuildContext, BuildRequest, BuildStepState, BuildStep, BuildState, Build, BuildLogEvent, BUILD_STEP_TIMEOUT_MAX_MS } from './build.ts';
