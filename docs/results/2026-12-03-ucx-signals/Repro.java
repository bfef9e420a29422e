import java.lang.reflect.Method;
public class Repro {
  static volatile long sink;
  public static void main(String[] a) throws Exception {
    Thread spin = new Thread(() -> { long x = 0; while (true) { for (int i = 0; i < 1_000_000; i++) x += i ^ (x >>> 3); sink = x; } });
    spin.setDaemon(true); spin.start();
    Thread storm = new Thread(() -> { while (true) { Thread.getAllStackTraces(); } });
    storm.setDaemon(true); storm.start();
    Thread.sleep(300);
    Class<?> c = Class.forName("dev.kvferry.rdma.ucx.Ucx");
    Method m = c.getMethod("available");
    System.out.println("available=" + m.invoke(null));
    Thread.sleep(200);
    System.out.println("alive");
  }
}
