package dev.kvferry.cli;

import dev.kvferry.demo.Demo;
import dev.kvferry.demo.PythonEngineDemo;
import dev.kvferry.demo.DemoOptions;
import dev.kvferry.demo.ModeReport;
import dev.kvferry.rdma.cuda.Cuda;
import dev.kvferry.rdma.cuda.CudaUnavailableException;
import java.io.PrintWriter;
import java.util.List;
import java.util.concurrent.Callable;
import org.jspecify.annotations.Nullable;
import picocli.CommandLine.Command;
import picocli.CommandLine.Model.CommandSpec;
import picocli.CommandLine.Option;
import picocli.CommandLine.Spec;

/** {@code kvferry demo}: the main job, end to end, every byte verified. */
@Command(name = "demo", mixinStandardHelpOptions = true,
    description = {
      "Start a router, a prefill node and a decode node as separate JVMs on loopback, move the KV",
      "cache of a simulated workload in WRITE then READ mode, verify every byte on the decode side",
      "and check that no block leaked on either side. Exits 0 only if all of that holds.",
      "With --p-gpu and --d-gpu the KV caches are on GPUs: P fills each layer with a",
      "kernel on its compute stream, the cuda transport moves it (or tcp, staged through pinned",
      "host buffers), D checks it with a kernel."
    })
public final class DemoCommand implements Callable<Integer> {

  private static final DemoOptions D = DemoOptions.defaults();

  @Option(names = "--transport",
      description = "cma, tcp or ucx for host memory, cuda or tcp for GPUs (default: cma; cuda "
          + "with --p-gpu). ucx uses UCX_TLS from the environment when set.")
  @Nullable String transport;

  @Option(names = "--p-gpu", paramLabel = "N",
      description = "Put P's KV cache on CUDA device N (needs --d-gpu; default: host memory).")
  @Nullable Integer pGpu;

  @Option(names = "--d-gpu", paramLabel = "N",
      description = "Put D's KV cache on CUDA device N (the same id as --p-gpu: one GPU).")
  @Nullable Integer dGpu;

  @Option(names = "--modes", split = ",", description = "Modes to run, in order (default: write,read).")
  List<String> modes = D.modes();

  @Option(names = "--layers") int layers = D.layers();
  @Option(names = "--kv-heads") int kvHeads = D.kvHeads();
  @Option(names = "--head-dim") int headDim = D.headDim();
  @Option(names = "--block-size", description = "Tokens per block on both sides (default: 16).")
  int blockSize = D.blockSize();
  @Option(names = "--block-size-p", description = "Tokens per block on P (default: --block-size).")
  @Nullable Integer blockSizeP;
  @Option(names = "--block-size-d", description = "Tokens per block on D (default: --block-size).")
  @Nullable Integer blockSizeD;
  @Option(names = "--tp-p", description = "TP size of P: one worker per rank (default: 1).")
  int tpP = 1;
  @Option(names = "--tp-d", description = "TP size of D: one worker per rank (default: 1).")
  int tpD = 1;
  @Option(names = "--dtype-bytes") int dtypeBytes = D.dtypeBytes();
  @Option(names = "--mla", description = "MLA layout (one latent region per layer).") boolean mla;
  @Option(names = "--latent") int latent = D.latent();
  @Option(names = "--num-blocks-p", description = "Blocks per layer on P (default: 512).")
  int numBlocksP = D.numBlocksP();
  @Option(names = "--num-blocks-d", description = "Blocks per layer on D (default: 640).")
  int numBlocksD = D.numBlocksD();
  @Option(names = "--requests", description = "Requests per mode (default: 48).")
  int requests = D.requests();

  @Option(names = "--prompt-tokens", description = "Prompt length range MIN:MAX (default: 128:2048).")
  String promptTokens = D.promptMin() + ":" + D.promptMax();

  @Option(names = "--abort-rate", description = "Fraction of requests aborted at a random point (default: 0.1).")
  double abortRate = D.abortRate();

  @Option(names = "--prefix-hit-rate", description = "Fraction of requests D partly has cached (default: 0.25).")
  double prefixHitRate = D.prefixHitRate();

  @Option(names = "--concurrency", description = "Requests in flight at once (default: 8).")
  int concurrency = D.concurrency();

  @Option(names = "--seed", description = "Workload seed (default: 42).") long seed = D.seed();

  @Option(names = "--json", description = "Print one JSON object as the last line.") boolean json;

  @Option(names = "--engine", paramLabel = "KIND",
      description = "sim (the simulated engine inside the nodes, default) or python (kvferry's"
          + " reference engine in Python processes, each driving its node through the engine"
          + " port; D's tokens are compared with the same engine run without kvferry).")
  String engine = "sim";

  @Option(names = "--python", paramLabel = "PATH",
      description = "With --engine python: the interpreter (default: /usr/bin/python3, where"
          + " Debian's python3-msgpack and python3-numpy install).")
  String python = "/usr/bin/python3";

  @Spec CommandSpec spec;

  @Override
  public Integer call() throws Exception {
    PrintWriter err = spec.commandLine().getErr();
    if (engine.equals("python")) {
      return pythonDemo(err);
    }
    if (!engine.equals("sim")) {
      err.println("kvferry demo: --engine must be sim or python, got " + engine);
      return 2;
    }
    String[] range = promptTokens.split(":");
    if (range.length != 2) {
      err.println("kvferry demo: --prompt-tokens must be MIN:MAX, got " + promptTokens);
      return 2;
    }
    boolean gpus = pGpu != null || dGpu != null;
    String moves = transport != null ? transport : gpus ? "cuda" : "cma";
    DemoOptions options;
    try {
      options = new DemoOptions(moves, modes, layers, kvHeads, headDim, blockSize, dtypeBytes,
          mla, latent, numBlocksP, numBlocksD, requests, Integer.parseInt(range[0].trim()),
          Integer.parseInt(range[1].trim()), abortRate, prefixHitRate, concurrency, seed, true,
          tpP, tpD, blockSizeP != null ? blockSizeP : blockSize,
          blockSizeD != null ? blockSizeD : blockSize, pGpu != null ? pGpu : -1,
          dGpu != null ? dGpu : -1);
      long available = Demo.availableMemoryBytes();
      if (available >= 0) {
        // Refuse up front: a node the OOM killer ends midway prints no result at all.
        java.util.Optional<String> tooBig = Demo.memoryRefusal(options, available);
        if (tooBig.isPresent()) {
          throw new IllegalArgumentException(tooBig.get());
        }
      }
      if (gpus) {
        // Fail here, before any JVM starts: "CUDA not available: <reason>", or no such device.
        Cuda.requireDevice(options.pGpu());
        Cuda.requireDevice(options.dGpu());
      }
    } catch (IllegalArgumentException | CudaUnavailableException e) {
      err.println("kvferry demo: " + e.getMessage());
      return 2;
    }
    System.out.printf("kvferry demo: %d requests per mode, prompts %s tokens, %s transport, %s%n",
        requests, promptTokens, moves,
        mla ? "MLA latent " + latent : layers + " layers x " + kvHeads + " heads x " + headDim);
    if (gpus) {
      System.out.printf("KV caches on GPUs: P on GPU %d (%s), D on GPU %d (%s)%n", options.pGpu(),
          Cuda.deviceName(options.pGpu()), options.dGpu(), Cuda.deviceName(options.dGpu()));
    }
    if (options.tpP() != options.tpD() || options.blockSizeP() != options.blockSizeD()) {
      System.out.printf("P: TP %d, blocks of %d tokens; D: TP %d, blocks of %d tokens%s%n",
          options.tpP(), options.blockSizeP(), options.tpD(), options.blockSizeD(),
          options.blockSizeP() != options.blockSizeD() ? " (no prefix hits across block sizes)"
              : "");
    }
    try (Demo demo = new Demo(options)) {
      System.out.println("process logs: " + demo.logDir());
      List<ModeReport> reports = demo.run();
      Demo.printTable(reports, System.out);
      demo.doneWordsLine().ifPresent(System.out::println);
      boolean ok = reports.stream().allMatch(ModeReport::passed);
      System.out.println(ok ? "\nOK: every byte verified, no block leaked."
          : "\nFAILED: see the problems above and the logs in " + demo.logDir());
      if (json) {
        System.out.println(Demo.toJson(reports));
      }
      return ok ? 0 : 1;
    }
  }

  /** {@code --engine python}: see {@link PythonEngineDemo}. */
  private int pythonDemo(PrintWriter err) throws Exception {
    java.util.Optional<java.nio.file.Path> pkg = PythonEngineDemo.locatePackage();
    if (pkg.isEmpty()) {
      err.println("kvferry demo: the kvferry Python package (python/ of the checkout) was not"
          + " found; set KVFERRY_PYTHON_PATH to the folder holding kvferry/");
      return 2;
    }
    Process check = new ProcessBuilder(python, "-c", "import msgpack")
        .redirectErrorStream(true).start();
    if (check.waitFor() != 0) {
      err.println("kvferry demo: " + python + " cannot import msgpack; install Debian's"
          + " python3-msgpack (apt-get install -y python3-msgpack python3-numpy) or pass --python");
      return 2;
    }
    System.out.printf("kvferry demo: reference engines in Python (%s), P TP %d, D TP %d, modes %s%n",
        pkg.get(), tpP, tpD, String.join(",", modes));
    try (PythonEngineDemo demo = new PythonEngineDemo(
        java.nio.file.Path.of(python), pkg.get(), tpP, tpD)) {
      System.out.println("process logs: " + demo.logDir());
      List<PythonEngineDemo.Report> reports = demo.run(modes, System.out);
      PythonEngineDemo.printTable(reports, System.out);
      boolean ok = PythonEngineDemo.passed(reports);
      System.out.println(ok
          ? "\nOK: D's tokens equal the undisaggregated run's, every byte verified, no block leaked."
          : "\nFAILED: see the table above and the logs in " + demo.logDir());
      if (json) {
        System.out.println(PythonEngineDemo.toJson(reports));
      }
      return ok ? 0 : 1;
    }
  }
}
