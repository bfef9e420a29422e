package dev.kvferry.demo;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import org.junit.jupiter.api.Test;

class ModeReportTest {

  private static ModeReport report(int completed, int aborted, int failed, int mismatches,
      int leaked) {
    return new ModeReport("write", completed + aborted + failed + mismatches, completed, aborted,
        failed, 1 << 20, 1.0, 0.001, 1.0, 2.0, mismatches, leaked, List.of());
  }

  @Test
  void aRunThatCompletedRequestsWithNothingWrongPasses() {
    assertTrue(report(44, 4, 0, 0, 0).passed());
  }

  @Test
  void aRunInWhichEveryRequestAbortedFails() {
    assertFalse(report(0, 48, 0, 0, 0).passed());
  }

  @Test
  void aRunOfNoRequestsFails() {
    assertFalse(report(0, 0, 0, 0, 0).passed());
  }

  @Test
  void aMismatchAFailureOrALeakedBlockFailsTheRun() {
    assertFalse(report(44, 3, 0, 1, 0).passed());
    assertFalse(report(44, 3, 1, 0, 0).passed());
    assertFalse(report(44, 4, 0, 0, 1).passed());
  }
}
