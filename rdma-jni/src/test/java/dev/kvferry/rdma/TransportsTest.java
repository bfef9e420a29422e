package dev.kvferry.rdma;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import org.junit.jupiter.api.Test;

class TransportsTest {

  @Test
  void opensEachTransportByName() throws IOException {
    try (RegionRegistry registry = new RegionRegistry("E0")) {
      for (String name : Transports.NAMES) {
        if (name.equals("cuda") && !dev.kvferry.rdma.cuda.Cuda.available()) {
          continue; // needs a GPU; CudaTransportTest covers the refusal without one
        }
        if (name.equals("ucx") && !dev.kvferry.rdma.ucx.Ucx.available()) {
          continue; // needs libucp; UcxTransportTest says why it skips
        }
        try (Transport t = Transports.open(name, registry, TransportOptions.defaults())) {
          assertEquals(name, t.name());
        }
      }
    }
  }

  @Test
  void unknownNameListsTheValidOnes() {
    try (RegionRegistry registry = new RegionRegistry("E0")) {
      IllegalArgumentException e =
          assertThrows(
              IllegalArgumentException.class,
              () -> Transports.open("rdma", registry, TransportOptions.defaults()));
      assertEquals("unknown transport 'rdma'; valid: local, cma, tcp, cuda, ucx", e.getMessage());
    }
  }

  @Test
  void tcpListensWhereTheOptionsSayAndAdvertisesTheChosenHost() throws IOException {
    try (RegionRegistry registry = new RegionRegistry("E0");
        Transport t =
            Transports.open(
                "tcp",
                registry,
                TransportOptions.defaults().withTcpBind("127.0.0.1", 0).withTcpAdvertisedHost("kv-d0.local"))) {
      RegionDescriptor d = t.describe(registry.allocateHost(4096));
      assertEquals("kv-d0.local", d.tcpHost());
      assertTrue(d.tcpPort() > 0);
      assertTrue(registry.tokenMatches(d.token()));
    }
  }

  @Test
  void aTakenPortIsACheckedErrorNamingTheAddress() throws IOException {
    try (RegionRegistry registry = new RegionRegistry("E0");
        TcpTransport first = new TcpTransport(registry, TransportOptions.defaults())) {
      IOException e =
          assertThrows(
              IOException.class,
              () -> Transports.open("tcp", registry,
                  TransportOptions.defaults().withTcpBind("127.0.0.1", first.port())));
      assertTrue(e.getMessage().startsWith("cannot listen on 127.0.0.1:" + first.port()), e.getMessage());
    }
  }
}
